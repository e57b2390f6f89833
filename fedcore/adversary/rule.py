"""A rule whose Byzantine rows lie: :class:`Attacked` wraps any synchronous rule.

Every engine runs a rule through its own adapter, so an attack written once here runs on
each of them, as every rule does:

* a **sender attack** (``signflip``, ``scale``, ``gaussian``, ``inflate``, ``withhold``)
  changes what a Byzantine row sends (its :class:`~fedcore.algorithms.rule.Send`) before
  the codec encodes it: on a real ``fedcore node`` the Byzantine peer itself sends it,
  well-formed;
* a **targeted attack** (``alie``, ``ipm``, ``dissensus``) is what each Byzantine
  in-neighbour sends one honest target, made of the values the target's honest
  in-neighbours send it in the same phase: the mix of every honest row replaces its
  Byzantine slots by it before the rule reads them. Only a simulation sees those values,
  so only the in-process engines run it.

A Byzantine row otherwise runs the rule as an honest one: its state is kept and
checkpointed as any row's, and the run's figures leave it out.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedcore.adversary import attacks
from fedcore.adversary.choose import Liars
from fedcore.algorithms.base import TRAITS
from fedcore.algorithms.rule import Gathered, Rows, Rule, Send, SenderRows, Slot, schema_of
from fedcore.config.tables.adversary import AdversaryConfig
from fedcore.counter_random import hash64_tensor, make_key, string_id
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.messages import MessageSchema

__all__ = ["Attacked", "attacked"]

_HOOKS = ("trains", "talks", "lossless", "local_step", "accept", "widths")


def attacked(rule: Any, adversary: AdversaryConfig, run_seed: int) -> Any:
    """``rule`` with the Byzantine peers of ``adversary``: an :class:`Attacked` rule, or
    ``rule`` itself where no peer lies.

    Raises:
        ConfigError: the algorithm cannot take the attack (one line that says why).
    """
    if not adversary.active:
        return rule
    return Attacked(rule, adversary, run_seed)


class Attacked(Rule):
    """``rule``, with the rows of the Byzantine peers sending what ``adversary`` says
    (see the module docstring)."""

    def __init__(self, rule: Any, adversary: AdversaryConfig, run_seed: int) -> None:
        """Wrap ``rule`` (a :class:`Rule`).

        Raises:
            ConfigError: a rule that is not a :class:`Rule`, one whose messages go per
                edge, or a targeted attack the rule's messages do not allow.
        """
        if Rule not in type(rule).__mro__:
            raise ConfigError(
                f"[adversary] runs on synchronous rules; algorithm "
                f"{getattr(rule, 'name', rule)!r} is not one (an asynchronous algorithm or "
                "a per-message one): remove [adversary] or choose a rule."
            )
        if rule.pattern == "edges":
            raise ConfigError(
                f"[adversary]: algorithm {rule.name!r} keeps state per edge (a message per "
                "edge), which the attacks do not model yet; choose a gossip or push-sum rule."
            )
        if adversary.targeted and rule.pattern not in ("neighbours", "chosen"):
            raise ConfigError(
                f"adversary.attack = {adversary.attack!r} is made of a target's in-neighbours' "
                f"values; algorithm {rule.name!r} sends nobody anything (pattern "
                f"{rule.pattern!r})."
            )
        if adversary.attack == "dissensus" and rule.pattern != "neighbours":
            raise ConfigError(
                f"adversary.attack = 'dissensus' cancels a target's gossip step; algorithm "
                f"{rule.name!r} does not gossip (pattern {rule.pattern!r}). Use alie or ipm."
            )
        if adversary.view == "omniscient" and rule.mixing == "push-sum":
            raise ConfigError(
                f"adversary.view = 'omniscient' reads every peer's value; algorithm "
                f"{rule.name!r} sends push-sum shares, one per edge, not values: use view = "
                "'neighbours'."
            )
        if adversary.attack == "dissensus" and rule.mixing == "push-sum":
            raise ConfigError(
                f"adversary.attack = 'dissensus' cancels a target's gossip step; algorithm "
                f"{rule.name!r} mixes push-sum shares, which it does not model. Use alie or "
                "ipm, or inflate/withhold for push-sum."
            )
        self.rule = rule
        self.adversary = adversary
        self.liars = Liars(adversary, run_seed, getattr(rule, "server", None))
        self.key = make_key("fedcore.adversary.noise", run_seed, adversary.seed)
        self.name: str = rule.name
        self.mixing: str = rule.mixing
        self.phases: int = int(rule.phases)
        self.pattern: str = rule.pattern
        for trait in TRAITS:
            setattr(self, trait, getattr(rule, trait))
        for hook in _HOOKS:
            setattr(self, hook, getattr(rule, hook))
        self.edge_fields = rule.edge_fields

    def __repr__(self) -> str:
        return f"Attacked({self.rule!r}, attack={self.adversary.attack!r})"

    def schema(self, phase: int, rows: Rows) -> MessageSchema:
        """The rule's messages: a lie is as well-formed as the truth."""
        return schema_of(self.rule, phase, rows)

    def init(self, params: torch.Tensor) -> Any:
        """The rule's state."""
        return self.rule.init(params)

    def model(self, state: Any) -> torch.Tensor:
        """The rule's models."""
        out: torch.Tensor = self.rule.model(state)
        return out

    def step(self, state: Any, grad: torch.Tensor, rows: Rows) -> tuple[Any, Send | None]:
        """The rule's step; what the Byzantine rows send, changed."""
        new, send = self.rule.step(state, grad, rows)
        return new, self._sent(send, rows, 0)

    def mix(self, state: Any, phase: int, inbox: Any, rows: Rows) -> tuple[Any, Send | None]:
        """The rule's mix, the Byzantine slots of an honest row's inbox replaced (targeted
        attacks); what the Byzantine rows send next, changed (sender attacks)."""
        if isinstance(inbox, list) and inbox:
            self._refuse_illegal(inbox, phase, rows)
        if self.adversary.targeted and isinstance(inbox, Gathered):
            inbox = self._targeted_gathered(inbox, state, rows)
        elif self.adversary.targeted and inbox:
            inbox = self._targeted(inbox, state, rows)
        new, send = self.rule.mix(state, phase, inbox, rows)
        return new, self._sent(send, rows, phase + 1)

    def _refuse_illegal(self, inbox: list[Slot], phase: int, rows: Rows) -> None:
        """Stop the run where an arrived scalar breaks the message schema, as a real peer
        refuses such a message before its rule reads it (strict mode stops there): a lie
        can drive an honest peer's own values out of range (push-sum weights that grow
        past ``n`` under ``inflate``), and the in-process engines must not mix what a
        peer would refuse."""
        specs = schema_of(self.rule, phase, rows).scalars
        for slot in inbox:
            for name, value in slot.scalars.items():
                spec = specs.get(name)
                if spec is None:
                    continue
                low = value >= spec.low if spec.low_closed else value > spec.low
                legal = low & (value <= spec.high) & torch.isfinite(value)
                rows.check(
                    slot.arrived & ~legal,
                    f"node {{node}}, round {{round}}: an in-neighbour's {name!r} is outside "
                    f"({spec.low:g}, {spec.high:g}] ({spec.why}); a real peer refuses such a "
                    "message, and strict mode stops there (the lie drove an honest peer's "
                    "values out of range)",
                )

    # -- sender attacks --------------------------------------------------------------------

    def _sent(self, send: Send | None, rows: Rows, phase: int) -> Send | None:
        a = self.adversary
        if send is None or a.targeted or a.attack == "labelflip":  # labelflip: the data lies
            return send
        liar = self.liars.rows(rows)
        if not bool(liar.any()):
            return send
        if a.attack in ("inflate", "withhold"):
            return self._mass(send, liar, rows, phase)
        tensors = {
            name: self._lie(value, liar, rows, phase, name) for name, value in send.tensors.items()
        }
        return Send(tensors, send.scalars, send.weighted, send.to, send.shared)

    def _mass(self, send: Send, liar: torch.Tensor, rows: Rows, phase: int) -> Send:
        """``inflate`` and ``withhold``: every tensor and scalar of a Byzantine row times
        ``scale``, the factor cut where a scalar would pass its schema's upper bound (a
        push-sum weight stays a legal share: the lie stays well-formed)."""
        factor = torch.full(
            liar.shape, self.adversary.scale, dtype=torch.float64, device=liar.device
        )
        specs = schema_of(self.rule, phase, rows).scalars
        for name, value in send.scalars.items():
            spec = specs.get(name)
            if spec is None or not math.isfinite(spec.high):
                continue
            v = value.to(torch.float64)
            room = torch.where(v > 0, spec.high / v.clamp(min=1e-300), factor)
            factor = torch.minimum(factor, room)
        factor = torch.where(liar, factor, 1.0)
        tensors = {
            name: torch.where(
                liar.view(-1, *([1] * (value.dim() - 1))),
                value * factor.to(value.dtype).view(-1, *([1] * (value.dim() - 1))),
                value,
            )
            for name, value in send.tensors.items()
        }
        scalars = {
            name: torch.where(liar, value * factor.to(value.dtype), value)
            for name, value in send.scalars.items()
        }
        return Send(tensors, scalars, send.weighted, send.to, send.shared)

    def _lie(
        self, value: torch.Tensor, liar: torch.Tensor, rows: Rows, phase: int, name: str
    ) -> torch.Tensor:
        a = self.adversary
        if a.attack == "signflip":
            lie = attacks.signflip(value, a.scale)
        elif a.attack == "scale":
            lie = attacks.scaled(value, a.scale)
        else:  # gaussian: keyed by the sender, the round, the phase and the tensor
            key = hash64_tensor(self.key, rows.index, rows.round, phase, string_id(name))
            lie = attacks.gaussian(value, a.sigma, key)
        where = liar.view(-1, *([1] * (value.dim() - 1)))
        return torch.where(where, lie.to(value.dtype), value)

    # -- targeted attacks ------------------------------------------------------------------

    def _targeted(self, inbox: list[Slot], state: Any, rows: Rows) -> list[Slot]:
        every = self.liars.mask(rows)
        honest_row = ~every[rows.index]
        liars, honest = [], []
        for slot in inbox:
            if slot.sender is None:
                raise AlgorithmError(
                    "[adversary]: this engine does not say who sent each message, which a "
                    "targeted attack needs; run it on the vectorized or messages engine."
                )
            from_liar = every[slot.sender]
            liars.append(from_liar & slot.arrived & honest_row)
            honest.append(slot.arrived & ~from_liar)
        if not any(bool(m.any()) for m in liars):
            return inbox
        names = list(inbox[0].tensors)
        shares = self.rule.mixing == "push-sum" and "omega" in inbox[0].scalars
        lies: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name in names:
            values = [slot.tensors[name] for slot in inbox]
            if shares:  # push-sum: the honest models are the shares' ratios s_k / w_k
                values = [
                    _ratio(v, slot.scalars["omega"]) for v, slot in zip(values, inbox, strict=True)
                ]
            if self.adversary.view == "omniscient":
                lies[name] = self._omniscient(inbox[0].tensors, name, every)
                continue
            lies[name] = self._lie_to(values, inbox, honest, liars, state)
        out = []
        for slot, from_liar in zip(inbox, liars, strict=True):
            if not bool(from_liar.any()):
                out.append(slot)
                continue
            tensors = {}
            for name in names:
                value = slot.tensors[name]
                lie, usable = lies[name]
                if shares:  # the liar's model as a share of the liar's own weight
                    w = slot.scalars["omega"].to(lie.dtype).view(-1, *([1] * (lie.dim() - 1)))
                    lie = lie * w
                where = (from_liar & usable).view(-1, *([1] * (value.dim() - 1)))
                tensors[name] = torch.where(where, lie, value)
            out.append(
                Slot(tensors, slot.scalars, slot.weight, slot.arrived, slot.one, slot.sender)
            )
        return out

    def _omniscient(
        self, tensors: Any, name: str, every: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lie, usable)`` of ``view = "omniscient"``: ``alie`` or ``ipm`` of every
        honest peer's value of ``name`` this phase (the senders' whole stack, which only
        the vectorized engine holds), the same lie to every target."""
        if not isinstance(tensors, SenderRows):
            raise AlgorithmError(
                "adversary.view = 'omniscient' needs every peer's value at once, which only "
                "the vectorized engine holds; run it there, or use view = 'neighbours'."
            )
        stack = tensors.stack(name)
        honest = stack[~every].to(torch.float64)
        mean = honest.mean(dim=0, keepdim=True)
        sd = honest.std(dim=0, correction=0, keepdim=True) if honest.shape[0] else mean * 0
        a = self.adversary
        if a.attack == "alie":
            z = a.z or attacks.alie_z(self.liars.population, self.liars.count)
            lie = attacks.alie(mean, sd, z)
        else:
            lie = attacks.ipm(mean, a.epsilon)
        b = tensors.rows(name).shape[0]
        usable = torch.full((b,), honest.shape[0] > 0, dtype=torch.bool, device=stack.device)
        return lie.to(stack.dtype).expand(b, *stack.shape[1:]), usable

    def _targeted_gathered(self, inbox: Gathered, state: Any, rows: Rows) -> Gathered:
        """A list inbox (a server's): each honest receiver's messages from Byzantine
        senders replaced by the lie made of its honest messages (``alie``, ``ipm``). A
        model (tensor ``"x"``) is lied about as an update, relative to the receiver's own
        model (the server's global model): ``ipm`` sends ``x_s - epsilon * mean_k (x_k -
        x_s)``, as the federated literature's attacks on updates; other tensors (steps,
        gradients) as they are."""
        if inbox.src is None:
            raise AlgorithmError(
                "[adversary]: this engine does not say who sent each message, which a "
                "targeted attack needs; run it on the vectorized or messages engine."
            )
        every = self.liars.mask(rows)
        liar_sent = every[inbox.src]
        from_liar = liar_sent & ~every[rows.index][inbox.dst]
        if not bool(from_liar.any()):
            return inbox
        a = self.adversary
        models = self.rule.model(state)
        tensors: dict[str, torch.Tensor] = {}
        for name in inbox.tensors:
            values = inbox.tensors[name]
            out = values.clone()
            updates = name == "x" and values.shape[1:] == models.shape[1:]
            for r in torch.unique(inbox.dst[from_liar]).tolist():
                mine = inbox.dst == r
                honest = torch.nonzero(mine & ~liar_sent).squeeze(1).tolist()
                if not honest:  # nothing to make a lie of: the liars' own values stand
                    continue
                one = torch.ones(1, dtype=torch.bool, device=values.device)
                base = models[r : r + 1].to(torch.float64) if updates else None
                rows_of = [values[m : m + 1].to(torch.float64) for m in honest]
                if base is not None:
                    rows_of = [v - base for v in rows_of]
                mean, sd, _ = attacks.honest_moments(rows_of, [one] * len(honest))
                if a.attack == "alie":
                    z = a.z or attacks.alie_z(self.liars.population, self.liars.count)
                    lie = attacks.alie(mean, sd, z)
                else:
                    lie = attacks.ipm(mean, a.epsilon)
                if base is not None:
                    lie = base + lie
                out[mine & from_liar] = lie.to(values.dtype)
            tensors[name] = out
        return Gathered(tensors, inbox.scalars, inbox.dst, inbox.b, inbox.src)

    def _lie_to(
        self,
        values: list[torch.Tensor],
        inbox: list[Slot],
        honest: list[torch.Tensor],
        liars: list[torch.Tensor],
        state: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lie, usable)``: what the Byzantine in-neighbours send each honest row (one of
        ``values``' tensors), and ``[B]`` where there is a lie to make (``alie`` and
        ``ipm``: a row none of whose honest in-neighbours' messages arrived has none, and
        its liars' own values stand)."""
        a = self.adversary
        dtype = values[0].dtype
        if a.attack == "dissensus":
            own = self.rule.model(state)
            usable = torch.ones(values[0].shape[0], dtype=torch.bool, device=values[0].device)
            if own.shape != values[0].shape:  # not a model-shaped tensor: left as sent
                return values[0], ~usable
            liar_weight = torch.zeros(own.shape[0], dtype=torch.float64, device=own.device)
            for slot, m in zip(inbox, liars, strict=True):
                liar_weight += slot.weight.to(torch.float64) * m.to(torch.float64)
            weights = [slot.weight for slot in inbox]
            lie = attacks.dissensus(own, values, weights, honest, liar_weight, a.push)
            return lie.to(dtype), usable
        mean, sd, count = attacks.honest_moments(values, honest)
        if a.attack == "alie":
            z = a.z or attacks.alie_z(self.liars.population, self.liars.count)
            lie = attacks.alie(mean, sd, z)
        else:
            lie = attacks.ipm(mean, a.epsilon)
        return lie.to(dtype), count > 0


def _ratio(share: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A push-sum share's model ``s / w`` (``s`` itself where ``w`` is 0)."""
    w = torch.where(weight > 0, weight, 1.0).to(share.dtype)
    return share / w.view(-1, *([1] * (share.dim() - 1)))
