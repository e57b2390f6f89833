"""The cohort engine of ``fedcore simulate`` (``simulate.engine = "cohort"``): the server
family's FedAvg over a population of clients with only the round's cohort in memory.

The vectorized engine holds a model row for every worker of the star, its graph, and every
worker's data part; a population of a million clients with a hundred a round does not fit
that way, and need not: a worker that is not sampled only holds the global model. This
engine holds

* the global model and the server optimizer's state (one row each);
* the stacked rows of the ``m`` clients sampled this round, trained with the vectorized
  engine's :class:`~fedcore.stacked_training.StackedObjective` and mixed by the run's own
  :class:`~fedcore.algorithms.server.FedAvgRule` (its phase-0 mix over a
  :class:`~fedcore.algorithms.rule.Gathered` of the cohort's messages);
* per client that has ever been sampled, where it is in its data (:class:`ClientStore`:
  the streams of the last ``2 m`` clients whole, every other one parked as two integers),
  and, with a node optimizer (``[optimizer]``), its optimizer state (one row per field, in
  :attr:`ClientStore.states`): the state a FedAvg client keeps across rounds.

The cohort is :func:`~fedcore.algorithms.server.sample_indices` of ``(run.seed, t)``
(``algorithm.sampler = "floyd"``: O(m) a round), and a client's examples are
:func:`~fedcore.data.partitions.slice_part` of ``(run.seed, i)`` (``data.partition =
"slices"``), computed when it is sampled. Nothing here is O(N) in Python objects: no
graph, no part, no record per client.

Every figure the engine reports is the vectorized engine's for the same config, bit for
bit (``tests/engines/test_cohort.py``): the global model, the ``"round"`` records, and the
``"eval"`` records' average-model figures. Per-client figures of clients it does not hold
(a worker's accuracy, the consensus distance, per-node records) it does not report;
:func:`cohort_refusal` says what else it does not run.

Over ranks (``ranks``), client ``i`` is trained on rank ``i % world``, which alone holds
its state; :meth:`CohortNetwork._gather` brings every rank's rows to every rank in the
cohort's order, so each rank mixes the same rows in the same order: the same bits for any
number of ranks.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from fedcore.algorithms.rule import Gathered, Rows, SenderRows, lossless, schema_of
from fedcore.algorithms.server import FedAvgRule, FedAvgState, cohort_size, sample_indices
from fedcore.compression import CodecOptions, codec_seed
from fedcore.compression.batched import make_row_codec
from fedcore.config import Config
from fedcore.data import Dataset, StackedBatches, load_dataset
from fedcore.data.partitions import slice_order, slice_part, slice_size
from fedcore.engines.ranks import Ranks, lost
from fedcore.errors import ConfigError
from fedcore.node.schedule import NodeOptions
from fedcore.setup import checkpoint
from fedcore.setup.plan import AlgorithmInputs, configured_algorithm, node_optimizer
from fedcore.setup.prepare import NodeInputs, node_options
from fedcore.setup.training import build_evaluator, make_objective
from fedcore.stacked_training import StackedObjective

__all__ = ["ClientStore", "CohortFigures", "CohortNetwork", "cohort_refusal"]

_STREAM_SEED = 1_000_003
"""A client's batch stream seed is ``run.seed * _STREAM_SEED + i`` (its graph index on
the star, as the other engines seed it)."""


def cohort_refusal(config: Config) -> str | None:
    """Why the cohort engine cannot run ``config`` (one clause, saying what to set), or
    None; from the config alone, before any data is loaded."""
    algorithm, data, run = config.algorithm, config.data, config.run
    options = algorithm.options
    checks = (
        (
            algorithm.name != "fedavg",
            f"it runs FedAvg of the server family only, not algorithm.name = "
            f"{algorithm.name!r} (use simulate.engine = 'auto')",
        ),
        (
            config.topology.file != "" or config.topology.kind != "star",
            "it needs the generated star (topology.kind = 'star', no topology.file)",
        ),
        (
            options.get("sampler", "sha256") != "floyd",
            "it needs algorithm.sampler = 'floyd' (the 'sha256' sample hashes every client "
            "each round)",
        ),
        (
            bool(data.stream),
            "it reads a dataset's examples, not an online stream (leave data.stream out)",
        ),
        (
            data.partition != "slices",
            "it finds a client's examples by index: set data.partition = 'slices'",
        ),
        (
            config.faults.active,
            "it runs without faults: leave [faults] out",
        ),
        (
            config.time.active,
            "it runs without virtual time: leave [time] out",
        ),
        (
            config.privacy.active,
            "it runs without differential privacy: leave [privacy] out",
        ),
        (
            config.transport.mode != "strict",
            "it models strict mode: set transport.mode = 'strict'",
        ),
        (
            config.simulate.node_records in ("all", "eval"),
            "it writes no per-client records (they would need every client): set "
            "simulate.node_records = 'none'",
        ),
        (
            run.regret,
            "the regret curve needs every client's losses: set run.regret = false",
        ),
        (
            run.tensorboard or run.csv,
            "it writes metrics.jsonl only: set run.tensorboard = false and run.csv = false",
        ),
        (
            run.eval_peers != "all",
            "it evaluates the global model alone, no client's own: leave run.eval_peers "
            "out (or 'all')",
        ),
    )
    for refused, why in checks:
        if refused:
            return why
    c = config.compression
    codec = make_row_codec(c.codec, CodecOptions.of(c), seeds=(codec_seed(run.seed, 0),))
    dtype = torch.float64 if config.model.dtype == "float64" else torch.float32
    if not codec.lossless(dtype):
        return (
            f"it sends models as they are, not in compression.codec = {c.codec!r} (for a "
            f"{config.model.dtype} model): set compression.codec = 'fp32'"
            + (" and model.dtype = 'float32'" if dtype != torch.float32 else "")
        )
    return None


class _ClientStream(StackedBatches):
    """One client's batch stream (a one-row :class:`~fedcore.data.StackedBatches`, so its
    batches are the vectorized engine's row's) that can be parked as two integers: the
    epochs it has started and its position in the last one. Its generator is a pure
    function of its seed, so :meth:`__init__` with them replays the epochs' permutations
    and is where it was."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        part: np.ndarray,
        *,
        batch_size: int,
        seed: int,
        order: str,
        device: torch.device,
        parked: tuple[int, int] = (1, 0),
    ) -> None:
        """The stream from its start, or from where it was ``parked``."""
        super().__init__(
            x, y, [part], batch_size=batch_size, seeds=[seed], order=order, device=device
        )
        self.epochs = 1  # the first permutation is drawn on construction
        epochs, position = parked
        first = np.zeros(1, dtype=np.int64)
        while self.epochs < epochs:
            self._new_orders(first)
            self.epochs += 1
        self._pos_np[0] = position

    def next_positions(self) -> torch.Tensor:
        """The client's next batch, as positions in its part (:meth:`take`)."""
        if self._pos_np[0] + self._batch_np[0] > self._sizes_np[0]:  # take starts an epoch
            self.epochs += 1
        return self.take(0)

    def parked(self) -> tuple[int, int]:
        """``(epochs started, position)``: all it takes to continue it."""
        return self.epochs, int(self._pos_np[0])


class ClientStore:
    """Where each client that has been sampled is in its data, the only state a FedAvg
    client keeps across rounds: the streams of the last ``live`` clients used (an LRU of
    :class:`_ClientStream`), and every other client sampled so far parked as two integers
    (epochs started, position), rebuilt when it is sampled again. Clients never sampled
    hold nothing.

    Args:
        dataset: The training data every client's examples index.
        order: The ``slices`` permutation (:func:`~fedcore.data.partitions.slice_order`).
        k: Examples a client.
        batch_size, order_kind, seed, device: As the other engines' streams.
        live: Streams kept whole (at least a cohort's, so a client sampled every round
            never replays its epochs).
    """

    def __init__(
        self,
        dataset: Dataset,
        order: np.ndarray,
        k: int,
        *,
        batch_size: int,
        order_kind: str,
        seed: int,
        device: torch.device,
        live: int,
    ) -> None:
        """Hold nothing yet."""
        self.x = dataset.x_train.to(device)
        self.y = dataset.y_train.to(device)
        self.order = order
        self.k = k
        self.batch_size = batch_size
        self.order_kind = order_kind
        self.seed = seed
        self.device = device
        self.live = live
        self.streams: OrderedDict[int, tuple[_ClientStream, torch.Tensor]] = OrderedDict()
        self.parked: dict[int, tuple[int, int]] = {}
        self.states: dict[int, tuple[torch.Tensor, ...]] = {}
        """Each client's node optimizer state, one row per field (a run with one)."""

    def __len__(self) -> int:
        """Clients held (every client sampled so far)."""
        return len(self.streams) + len(self.parked)

    def optimizer_state(self, clients: list[int], fresh: Any) -> Any:
        """The node optimizer states of ``clients``, stacked (``fresh``, one row a field:
        a client's before its first step)."""
        rows = [self.states.get(i, fresh) for i in clients]
        return type(fresh)(*(torch.stack(field) for field in zip(*rows, strict=True)))

    def keep_optimizer_state(self, clients: list[int], state: Any) -> None:
        """Keep each of ``clients``' row of the stacked ``state`` (copies: no row holds the
        stack's memory)."""
        for j, i in enumerate(clients):
            self.states[i] = tuple(field[j].clone() for field in state)

    def _stream(self, i: int) -> tuple[_ClientStream, torch.Tensor]:
        held = self.streams.get(i)
        if held is not None:
            self.streams.move_to_end(i)
            return held
        part = slice_part(self.order, i, self.k)
        stream = _ClientStream(
            self.x,
            self.y,
            part,
            batch_size=self.batch_size,
            seed=self.seed * _STREAM_SEED + i,
            order=self.order_kind,
            device=self.device,
            parked=self.parked.pop(i, (1, 0)),
        )
        held = self.streams[i] = (stream, torch.from_numpy(part).to(self.device))
        while len(self.streams) > self.live:
            j, (old, _) = self.streams.popitem(last=False)
            self.parked[j] = old.parked()
        return held

    def batches(self, clients: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch of each of ``clients`` (in that order): ``x [m, b, ...]`` and
        ``y [m, b]``, each client's as its stream in the vectorized engine draws it."""
        rows = []
        for i in clients:
            stream, part = self._stream(i)
            rows.append(part[stream.next_positions()])
        idx = torch.stack(rows)
        return self.x[idx], self.y[idx]


@dataclass(frozen=True, slots=True)
class CohortFigures:
    """What one round did: the cohort's training losses (float64, in client order), the
    messages and bytes that went."""

    round: int
    clients: list[int]
    losses: list[float]
    sent: int
    bytes_sent: int


class CohortNetwork:
    """FedAvg over ``topology.nodes`` clients with only the cohort in memory (see the
    module docstring).

    Raises:
        ConfigError: :func:`cohort_refusal` gives a reason.
        DataError: the data cannot be loaded or sliced.
    """

    def __init__(self, config: Config, *, device: torch.device, ranks: Ranks | None = None) -> None:
        """Load the data, build the model and the rule; hold no client yet. With
        ``ranks`` (a sharded run, joined already), this rank trains the clients ``i`` of
        each cohort with ``i % world == rank`` and holds only theirs."""
        why = cohort_refusal(config)
        if why is not None:
            raise ConfigError(f"simulate.engine = 'cohort' cannot run this config: {why}.")
        self.config = config
        self.device = device
        self.ranks = ranks
        run, data = config.run, config.data
        self.n = config.topology.nodes
        rule = configured_algorithm(AlgorithmInputs.of(config))
        assert isinstance(rule, FedAvgRule)  # cohort_refusal: fedavg
        rule.check_workers(self.n)
        self.rule = rule
        self.m = cohort_size(self.n, rule.fraction)
        self.dataset = load_dataset(
            data.dataset, seed=run.seed, test_fraction=data.test_fraction, root=data.root
        )
        self.k = slice_size(len(self.dataset.y_train), self.n, data.examples_per_node)
        self.evaluator = build_evaluator(config.model, run.seed, self.dataset)
        mode = self.evaluator.rows.mode
        self.objective = StackedObjective(
            lambda: make_objective(config.model, run.seed, self.dataset, mode),
            device,
            self.evaluator,
        )
        self.options: NodeOptions = node_options(NodeInputs.of(config), "")
        self.store = ClientStore(
            self.dataset,
            slice_order(len(self.dataset.y_train), run.seed),
            self.k,
            batch_size=data.batch_size,
            order_kind=data.order,
            seed=run.seed,
            device=device,
            live=2 * self.m,
        )
        start = self.evaluator.initial_params().to(device)
        self.x = start.unsqueeze(0)  # [1, d]: the server's row, the global model
        self.optimizer = node_optimizer(config.optimizer, self.evaluator.segments)
        # A client's optimizer state before its first step: its row of the vectorized
        # engine's init over every row (each the start).
        self.fresh: Any = None
        if self.optimizer is not None:
            init = self.optimizer.init(self.x)
            self.fresh = type(init)(*(field[0] for field in init))
        self.server_opt: Any = None
        self.received = False  # the clients hold the global model of a message (round >= 1)
        self.d = int(start.numel())
        self.batch = min(self.k, data.batch_size)
        self.samples = torch.full((self.m,), float(self.k), dtype=torch.float64, device=device)
        self.message_bytes = [self._message_bytes(p) for p in range(rule.phases)]
        self.round = 0

    def _message_bytes(self, phase: int) -> int:
        """Bytes one message of ``phase`` puts on the wire (as the vectorized engine sizes
        it: the schema's tensors in the codec, 8 bytes a scalar)."""
        stub = Rows(round=0, lr=0.0, self_weight=torch.zeros(1, dtype=torch.float64))
        schema = schema_of(self.rule, phase, stub)
        raw = lossless(self.rule, phase, stub)
        c = self.config.compression
        codec = make_row_codec(c.codec, CodecOptions.of(c), seeds=(codec_seed(0, 0),))
        itemsize = self.x.element_size()
        size = 8 * len(schema.scalars)
        for shape in schema.tensors.values():
            n = self.d if shape is None else int(np.prod(shape, dtype=np.int64))
            size += n * itemsize if raw else codec.nbytes(n, self.x.dtype)
        return size

    def model(self) -> torch.Tensor:
        """``[d]``: the global model (the server's), as it is now."""
        return self.x[0]

    def cohort(self, t: int) -> list[int]:
        """The clients of round ``t``, ascending (the other engines' sample of the run)."""
        return sample_indices(self.n, self.m, self.rule.seed, t)

    def run_round(self) -> CohortFigures:
        """Run round ``self.round``: the cohort's local steps from the global model, the
        server's mix of their models; return what it did."""
        t = self.round
        clients = self.cohort(t)
        ranks = self.ranks
        mine = clients if ranks is None else [i for i in clients if i % ranks.world == ranks.rank]
        rows, loss = self._train(t, mine)
        if ranks is not None:  # every rank's rows, in the cohort's order
            rows, loss = self._gather(ranks, clients, rows, loss)
        inbox = Gathered(
            SenderRows({"x": rows}, torch.arange(self.m, device=self.device)),
            {"samples": self.samples},
            torch.zeros(self.m, dtype=torch.long, device=self.device),
            1,
            torch.tensor(clients, dtype=torch.long, device=self.device),  # n{i} at index i
        )
        step_lr = self.options.lr_at(t) if self.optimizer is None else 1.0
        stub = Rows(
            round=t, lr=step_lr, self_weight=torch.zeros(1, dtype=torch.float64), n=self.n + 1
        )
        state, _ = self.rule.mix(FedAvgState(self.x, self.server_opt), 0, inbox, stub)
        self.x, self.server_opt = state.x, state.server_opt
        self.received = True
        self.round = t + 1
        m = self.m
        return CohortFigures(
            round=t,
            clients=clients,
            losses=loss.cpu().tolist(),
            sent=m * self.rule.phases,
            bytes_sent=m * sum(self.message_bytes),
        )

    def _train(self, t: int, clients: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, loss)``: the models of ``clients`` after their local steps of round
        ``t`` from the global model (the rule's step last), and their training losses."""
        lr = self.options.lr_at(t)
        step_lr = lr if self.optimizer is None else 1.0  # with an optimizer, the step is u
        steps = self.options.local_steps
        # Each client holds the global model: the start, or the server's last message
        # (received as 0 + x, which turns a -0.0 into 0.0: what index_add_ gives a peer).
        rows = (self.x + 0.0 if self.received else self.x).repeat(len(clients), 1)
        if not clients:
            return rows, torch.zeros(0, dtype=torch.float64, device=self.device)
        # The vectorized engine gives its server a stand-in part of one example, so its
        # batches are ragged (a mask, every worker's entries kept) unless batches are 1.
        mask = (
            torch.ones(len(clients), self.batch, dtype=torch.bool, device=self.device)
            if self.batch != 1
            else None
        )
        loss_sum: torch.Tensor | None = None
        loss = torch.empty(0)
        grad = torch.empty(0)
        opt = None if self.optimizer is None else self.store.optimizer_state(clients, self.fresh)
        for k in range(steps):
            x, y = self.store.batches(clients)
            losses, grad = self.objective.loss_and_grad(rows, x, y, mask)
            loss = losses.to(torch.float64)
            if self.optimizer is not None:
                grad, opt = self.optimizer.update(grad, opt, rows, lr)
            if steps > 1:
                loss_sum = loss if loss_sum is None else loss_sum + loss
            if k + 1 < steps:
                rows = rows - step_lr * grad
        if opt is not None:
            self.store.keep_optimizer_state(clients, opt)
        if loss_sum is not None:
            loss = loss_sum / steps
        rows = rows - step_lr * grad  # the rule's step: each sampled worker's last local step
        return rows, loss

    def _gather(
        self, ranks: Ranks, clients: list[int], rows: torch.Tensor, loss: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's trained rows and losses, put in the cohort's order on every rank
        (one ``all_gather`` of each, padded to the largest share): each rank then mixes
        the same rows in the same order, so the sum does not depend on the ranks."""
        world = ranks.world
        owner = [i % world for i in clients]
        counts = [owner.count(r) for r in range(world)]
        widest = max(counts)
        out_rows = rows.new_empty((self.m, self.d))
        out_loss = loss.new_empty(self.m)
        for local, out in ((rows, out_rows), (loss, out_loss)):
            padded = local.new_zeros((widest, *local.shape[1:]))
            padded[: local.shape[0]] = local
            parts = [torch.empty_like(padded) for _ in range(world)]
            try:
                dist.all_gather(parts, padded)
            except (RuntimeError, ValueError) as exc:
                raise lost(ranks, "the cohort's gather", exc) from exc
            taken = [0] * world
            for j, r in enumerate(owner):
                out[j] = parts[r][taken[r]]
                taken[r] += 1
        return out_rows, out_loss

    def state_dict(self) -> dict[str, Any]:
        """Everything :meth:`load_state_dict` needs to continue from this round exactly (a
        checkpoint, as CPU tensors): the global model, the server optimizer's state, and
        every held client's place in its data (live streams parked) and optimizer state."""
        store = self.store
        parked = {**store.parked, **{i: s.parked() for i, (s, _) in store.streams.items()}}
        clients = sorted(parked)
        states = [store.states[i] for i in sorted(store.states)]
        return {
            "round": self.round,
            "received": self.received,
            "x": self.x.cpu().clone(),
            "server_opt": checkpoint.to_tree(self.server_opt),
            "clients": torch.tensor(clients, dtype=torch.int64),
            "places": torch.tensor([parked[i] for i in clients], dtype=torch.int64),
            "state_clients": torch.tensor(sorted(store.states), dtype=torch.int64),
            "states": [torch.stack(f).cpu() for f in zip(*states, strict=True)] if states else [],
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of a network of the same config."""
        self.round = int(saved["round"])
        self.received = bool(saved["received"])
        self.x = saved["x"].to(self.device)
        self.server_opt = checkpoint.to_device(
            checkpoint.from_tree(saved["server_opt"]), self.device
        )
        store = self.store
        store.streams.clear()
        places = saved["places"].tolist()
        store.parked = {
            i: (int(e), int(p)) for i, (e, p) in zip(saved["clients"].tolist(), places, strict=True)
        }
        fields = [f.to(self.device) for f in saved["states"]]
        store.states = {
            i: tuple(f[j] for f in fields) for j, i in enumerate(saved["state_clients"].tolist())
        }

    def clients_held(self) -> int:
        """Clients held over every rank (a collective on a sharded run: every rank calls
        it, after the same rounds)."""
        held = torch.tensor([len(self.store)], dtype=torch.int64)
        if self.ranks is not None and self.ranks.world > 1:
            try:
                dist.all_reduce(held)
            except (RuntimeError, ValueError) as exc:
                raise lost(self.ranks, "the count of clients held", exc) from exc
        return int(held)

    def evaluate(self) -> tuple[float, float]:
        """``(loss, accuracy)`` of the global model on the test split (the other engines'
        average-model figures)."""
        ds = self.dataset
        loss, acc = self.evaluator.evaluate(self.model().cpu(), ds.x_test, ds.y_test)
        return float(loss), float(acc)

    def live_bytes(self) -> int:
        """Bytes of the tensors this network holds for its clients and model: the global
        model, the live clients' streams and the clients' optimizer states (for the memory
        test; a parked client's stream is two integers)."""
        total = self.x.numel() * self.x.element_size()
        for fields in self.store.states.values():
            total += sum(f.numel() * f.element_size() for f in fields)
        for stream, part in self.store.streams.values():
            total += part.numel() * part.element_size()
            total += stream._perm.numel() * stream._perm.element_size()
            total += stream._local.numel() * stream._local.element_size()
        return total


def mean_loss(losses: list[float]) -> float:
    """A round's training loss: the mean over the cohort, as the observer takes it."""
    return sum(losses) / len(losses) if losses else math.nan
