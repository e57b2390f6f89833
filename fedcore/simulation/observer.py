""":class:`RunObserver`: the records of a run as its rounds end, whatever ran it (every round of
every engine and of ``launch`` passes through :meth:`~RunObserver.end_round`): the
``metrics.jsonl`` records, the evaluations, traffic, faults, virtual time and regret the
summary reports, and whether the run is diverging."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedcore.adversary import byzantine
from fedcore.config import Config
from fedcore.data import Dataset
from fedcore.metrics import JsonlWriter, eval_peers_sample, evaluate_models, round_record
from fedcore.models import Objective
from fedcore.node import Node, RoundRecord
from fedcore.progress import Progress
from fedcore.simulation.regret import RegretTracker
from fedcore.simulation.tracking import Tracker

if TYPE_CHECKING:
    from fedcore.engines.messages import Network

__all__ = ["DIVERGING_FACTOR", "DIVERGING_WINDOW", "RunObserver"]


logger = logging.getLogger(__name__)

DIVERGING_FACTOR = 100.0
"""A run is diverging when the mean training loss of its last rounds, or its average
training loss, is more than this many times its first round's (or is not finite): see
:meth:`RunObserver.diverging`."""
DIVERGING_WINDOW = 10
"""The last rounds whose mean training loss :meth:`RunObserver.diverging` compares."""


class RunObserver:
    """Collects node records into metrics, evaluation records and progress.

    Evaluation happens at every ``eval_every``-th round and at the last round, once
    every node has reported that round: models are snapshotted as each node finishes
    the round, so nodes running ahead do not skew the evaluation.
    """

    def __init__(
        self,
        *,
        nodes: Sequence[str],
        config: Config,
        evaluator: Objective,
        dataset: Dataset,
        writer: JsonlWriter | None,
        progress: Progress | None,
        records: str = "all",
        server: str | None = None,
        regret: RegretTracker | None = None,
        tracker: Tracker | None = None,
        own_tests: Mapping[str, Any] | None = None,
    ) -> None:
        """Expect one record per node of ``nodes`` per round of ``config``; write them to
        ``writer`` as ``records`` says (``all``, ``eval``: on evaluation rounds, ``none``).
        ``server``: the server family's server, whose model is the one evaluated as the
        average model (:func:`~fedcore.metrics.evaluate_models`). ``regret``: the run's
        regret curve, brought up to each evaluation as it is recorded (see
        :func:`regret_tracker`). ``tracker``: where the round, evaluation and regret records
        also go (``run.tensorboard``, ``run.csv``; :mod:`fedcore.simulation.tracking`),
        closed by :func:`finish_run`. ``own_tests``: each node's own test examples
        (:meth:`~fedcore.setup.prepare.RunSetup.own_tests`), where the run has them."""
        self.nodes = tuple(nodes)
        self.own_tests = own_tests
        self.tracker = tracker
        self.regret = regret
        self.server = server
        self.records = records
        self.n = len(self.nodes)
        self.liars = frozenset(byzantine(config.adversary, config.run.seed, self.nodes, server))
        """The Byzantine peers (``[adversary]``): left out of every evaluation."""
        evaluated = self.n - (server in self.nodes) - len(self.liars)
        self.sample = eval_peers_sample(config.run.seed, evaluated, config.run.eval_peers)
        """The peers ``run.eval_peers`` samples (places among the evaluated nodes), or
        None for all of them."""
        self.rounds = config.run.rounds
        self.eval_every = config.run.eval_every
        self.evaluator = evaluator
        self.dataset = dataset
        self.writer = writer
        self.progress = progress
        self.evals: list[dict[str, Any]] = []
        self.totals = {
            "messages_sent": 0,
            "bytes_sent": 0,
            "messages_received": 0,
            "messages_missing": 0,
            "messages_late": 0,
            "messages_rejected": 0,
            "messages_dropped": 0,
            "fp32_bytes_sent": 0,
        }
        self.loss_sum = 0.0  # over completed rounds only, so it is exact at each evaluation
        self.loss_count = 0
        self.missing: dict[str, set[int]] = {}
        self._losses: dict[str, list[float | None]] | None = None  # made when first read
        self._loss_columns: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
        self.missing_edges: dict[str, int] = {}
        self.dropped_edges: dict[str, int] = {}
        self.down: dict[str, list[int]] = {}
        self._round_loss: dict[int, list[float | None]] = {}
        self._round_bytes: dict[int, int] = {}
        # messages sent, missing and dropped in each round not yet complete
        self._round_counts: dict[int, list[int]] = {}
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._bytes_done = 0
        self._last_acc: float | None = None
        self.rounds_done = 0  # rounds every node has reported (they complete in order)
        # The divergence check's figures: the first round's training loss (None before
        # it, or while no node ran a round), the last DIVERGING_WINDOW rounds' losses.
        self.first_loss: float | None = None
        self.recent_losses: list[float] = []
        # Virtual time (a simulation's clock): the run's, each node's seconds computing,
        # each pending round's latest end, and the first evaluation at the target accuracy.
        self.vtime: float | None = None
        self.busy: dict[str, float] = {}
        self._round_vtime: dict[int, float] = {}
        self.target = config.run.target_accuracy
        self.target_hit: dict[str, Any] | None = None

    _STATE = (
        "totals",
        "loss_sum",
        "loss_count",
        "losses",
        "missing_edges",
        "dropped_edges",
        "down",
        "evals",
        "_bytes_done",
        "_last_acc",
        "rounds_done",
        "first_loss",
        "recent_losses",
        "vtime",
        "busy",
        "target_hit",
    )

    @property
    def losses(self) -> dict[str, list[float | None]]:
        """Each node's loss of each round, in node order: ``None`` where the node was down
        or idle (a diverged node's NaN losses stay NaN), grown as rounds arrive (a run of
        many rounds allocates nothing up front); the rounds :meth:`add_losses` kept as
        columns are read in first."""
        if self._losses is None:
            self._losses = {n: [] for n in self.nodes}
        if self._loss_columns:
            columns, self._loss_columns = self._loss_columns, []
            table = np.empty((len(columns), self.n), dtype=object)
            for k, (values, trained) in enumerate(columns):
                table[k] = values.tolist()
                table[k, ~trained] = None
            for node, rounds in zip(self.nodes, table.T.tolist(), strict=True):
                self._losses[node].extend(rounds)
        return self._losses

    @losses.setter
    def losses(self, value: dict[str, list[float | None]]) -> None:
        self._losses, self._loss_columns = value, []

    def add_losses(self, values: torch.Tensor, trained: torch.Tensor) -> None:
        """Every node's loss of the next round (``values``, ``[N]`` on the CPU, in node
        order; ``trained`` says which count: the others' are ``None``), kept as one column
        until :attr:`losses` is read (a vectorized round accounts no node one by one)."""
        self._loss_columns.append((values.numpy(), trained.numpy()))

    def state_dict(self) -> dict[str, Any]:
        """What the observer has accounted (for a checkpoint, between rounds), as plain
        containers: the observer's own, not copies, so serialize them before going on."""
        if self._round_loss:
            raise RuntimeError("a checkpoint of the observer must fall between rounds")
        state = {key: getattr(self, key) for key in self._STATE}
        state["missing"] = {sender: sorted(r) for sender, r in self.missing.items()}
        return state

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (one written before the divergence check
        existed starts it over from the next round)."""
        for key in self._STATE:
            if key in saved:
                setattr(self, key, copy.deepcopy(saved[key]))
        self.missing = {sender: set(r) for sender, r in saved["missing"].items()}

    def is_eval_round(self, t: int) -> bool:
        """Whether round ``t`` (0-based) ends with an evaluation."""
        return (t + 1) % self.eval_every == 0 or t + 1 == self.rounds

    def attach(self, network: Network) -> None:
        """Observe every node of an in-process network."""
        for node in network.nodes.values():
            node.observer = self._on_node

    def _on_node(self, node: Node, record: RoundRecord) -> None:
        model = node.model().detach().clone() if self.is_eval_round(record.round) else None
        self.observe(record, model)

    def observe(self, record: RoundRecord, model: torch.Tensor | None) -> None:
        """Account one node's round; ``model`` is its parameters on evaluation rounds."""
        t = record.round
        if self.writer is not None and (
            self.records == "all" or (self.records == "eval" and self.is_eval_round(t))
        ):
            self.writer.write(record.to_json())
        for key in self.totals:
            self.totals[key] += getattr(record, key)
        for sender in record.missing:
            self.missing.setdefault(sender, set()).add(t)
            edge = f"{sender}->{record.node}"
            self.missing_edges[edge] = self.missing_edges.get(edge, 0) + 1
        for receiver in record.dropped_out:
            edge = f"{record.node}->{receiver}"
            self.dropped_edges[edge] = self.dropped_edges.get(edge, 0) + 1
        if record.down:
            self.down.setdefault(record.node, []).append(t)
        losses = self.losses[record.node]
        if len(losses) <= t:
            losses.extend([None] * (t + 1 - len(losses)))
        loss = None if record.down or record.idle else record.loss
        losses[t] = loss
        self._round_loss.setdefault(t, []).append(loss)
        self._round_bytes[t] = self._round_bytes.get(t, 0) + record.bytes_sent
        counts = self._round_counts.setdefault(t, [0, 0, 0])
        counts[0] += record.messages_sent
        counts[1] += record.messages_missing
        counts[2] += record.messages_dropped
        if record.vtime is not None:
            self._round_vtime[t] = max(self._round_vtime.get(t, record.vtime), record.vtime)
            self.busy[record.node] = self.busy.get(record.node, 0.0) + record.compute_s
        if model is not None:
            self._snapshots.setdefault(t, {})[record.node] = model
        if len(self._round_loss[t]) == self.n:
            self._round_complete(t)

    def _round_complete(self, t: int) -> None:
        losses = [x for x in self._round_loss.pop(t) if x is not None]  # not down nodes
        sent, missing, dropped = self._round_counts.pop(t)
        train_loss = self.end_round(
            t,
            losses,
            sent=sent,
            bytes_sent=self._round_bytes.pop(t),
            missing=missing,
            dropped=dropped,
            vtime=self._round_vtime.pop(t, None),
        )
        snapshots = self._snapshots.pop(t, None)
        if snapshots is not None and len(snapshots) == self.n:
            ordered = {nid: snapshots[nid] for nid in self.nodes}
            result = evaluate_models(
                self.evaluator,
                ordered,
                self.dataset.x_test,
                self.dataset.y_test,
                server=self.server,
                own_tests=self.own_tests,
                sample=self.sample,
                liars=self.liars,
            )
            self.add_eval(t, train_loss, result)
        if self.progress is not None:
            self.progress.update(t + 1, loss=train_loss, accuracy=self._last_acc)

    def end_round(
        self,
        t: int,
        losses: Sequence[float],
        *,
        sent: int,
        bytes_sent: int,
        missing: int,
        dropped: int,
        vtime: float | None = None,
    ) -> float:
        """Account round ``t`` as complete, every node's record observed (the vectorized
        engine's :class:`~fedcore.engines.vectorized.Flusher` calls this itself), and
        write its ``"kind": "round"`` record; ``losses`` are the up nodes'; ``vtime``: the
        virtual time at which the round ended (a simulation's clock). Returns the round's
        training loss (NaN when every node was down)."""
        train_loss = sum(losses) / len(losses) if losses else math.nan
        self._bytes_done += bytes_sent
        if vtime is not None:
            self.vtime = vtime
        if self.writer is not None or self.tracker is not None:
            record = round_record(
                t,
                train_loss=train_loss,
                nodes_up=len(losses),
                messages_sent=sent,
                bytes_sent=bytes_sent,
                messages_missing=missing,
                messages_dropped=dropped,
                vtime=vtime,
            )
            if self.writer is not None:
                self.writer.write(record)
            if self.tracker is not None:
                self.tracker.round(record)
        self.loss_sum += sum(losses)
        self.loss_count += len(losses)
        self.rounds_done = t + 1
        if losses:  # a round no node ran says nothing of the loss
            if self.first_loss is None:
                self.first_loss = train_loss
            self.recent_losses = [*self.recent_losses[-(DIVERGING_WINDOW - 1) :], train_loss]
        return train_loss

    def diverging(self) -> tuple[bool, str]:
        """``(diverging, why)``: whether the run blew up, and the figures that say so.

        The rule: with ``first`` the training loss of the first round some node ran, the
        run is diverging when either figure below is not finite, or exceeds
        :data:`DIVERGING_FACTOR` times ``first`` (compared only where ``first`` is finite
        and positive):

        * the mean training loss of the last :data:`DIVERGING_WINDOW` rounds some node
          ran (fewer in a shorter run): a run blowing up as it ends;
        * the run's average training loss (over every node and round, the summary's
          ``average_loss``): a run that blew up on its way. A minibatch loss of a model
          with huge weights swings between 0 and 1e5 from round to round, so the last
          rounds alone can miss it.

        A round's training loss is the mean, over the nodes that ran it, of each node's
        loss before its update (``metrics.jsonl``'s ``"kind": "round"`` ``train_loss``),
        the same on every engine and over gRPC.
        """
        if self.first_loss is None or not self.recent_losses or not self.loss_count:
            return False, ""
        first = self.first_loss
        figures = (
            (
                f"the mean training loss of the last {len(self.recent_losses)} rounds",
                sum(self.recent_losses) / len(self.recent_losses),
            ),
            ("the average training loss of the run", self.loss_sum / self.loss_count),
        )
        for what, value in figures:
            if not math.isfinite(value):
                return True, f"{what} is not finite ({value})"
        for what, value in figures:
            if math.isfinite(first) and first > 0 and value > DIVERGING_FACTOR * first:
                return True, (
                    f"{what}, {value:.4g}, is {value / first:.3g} times the first round's "
                    f"({first:.4g}); more than {DIVERGING_FACTOR:g} times"
                )
        return False, ""

    def add_eval(self, t: int, train_loss: float | None, result: Mapping[str, Any]) -> None:
        """Record the evaluation of round ``t`` (``result``: the models' figures)."""
        record: dict[str, Any] = {
            "kind": "eval",
            "round": t,
            "train_loss": train_loss,
            "average_loss": self.loss_sum / self.loss_count if self.loss_count else math.nan,
            "bytes_sent_per_node": self._bytes_done / self.n,
            **result,
        }
        if self.vtime is not None:
            record["vtime"] = self.vtime
        accuracy = result.get("avg_model_accuracy")
        if (
            self.target > 0
            and self.target_hit is None
            and accuracy is not None
            and accuracy >= self.target
        ):
            self.target_hit = {"round": t, "vtime": self.vtime, "accuracy": accuracy}
        self.evals.append(record)
        if self.regret is not None:  # the rounds since the last evaluation, once
            self.regret.update(self.losses, [e["round"] for e in self.evals])
        self._last_acc = result["avg_model_accuracy"]
        logger.debug("round %d evaluated: %s", t, _brief(record))
        if self.writer is not None:
            self.writer.write(record)
            self.writer.flush()
        if self.tracker is not None:
            self.tracker.evaluation(record)

    @property
    def last_accuracy(self) -> float | None:
        """The average model's accuracy at the last evaluation (None before the first)."""
        return self._last_acc


def _brief(record: Mapping[str, Any]) -> str:
    """An evaluation record's figures, for a debug line."""
    return ", ".join(
        f"{k} {v:.4g}" for k, v in record.items() if isinstance(v, float) and k != "round"
    )
