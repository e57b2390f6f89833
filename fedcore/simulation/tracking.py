"""Experiment tracking beside a run's records: TensorBoard event files
(``run.tensorboard``) and a CSV of the round aggregates (``run.csv``).

:class:`Tracker` is fed by :class:`~fedcore.simulation.observer.RunObserver`, the one
place that sees every round on both engines and for ``fedcore launch``/``summarize`` (its
``"kind": "round"`` and ``"kind": "eval"`` records, then the regret curve), so what it
writes is what ``metrics.jsonl`` holds:

* ``<run>/tensorboard/``: ``round/<key>`` scalars (``train_loss``, ``nodes_up``,
  ``messages_sent``, ``bytes_sent``, ``messages_missing``, ``messages_dropped``) at step
  ``round``; ``eval/<key>`` scalars (accuracies, losses, consensus distance, bytes sent per
  node so far) on evaluation rounds; ``regret/<key>`` scalars of a run with ``run.regret``;
  the effective config as text (``config``), written by
  :class:`torch.utils.tensorboard.SummaryWriter`.
* ``<run>/rounds.csv``: a header and one row a round, the round record's columns (an
  empty ``train_loss`` where no node ran the round).

A resumed run (``fedcore simulate --resume``) continues both from the checkpoint's round:
the CSV keeps its rows of earlier rounds and drops the rest, and the event files are
continued with ``purge_step`` (TensorBoard's readers discard the events of the earlier
session from that step on), so no round appears twice.
"""

from __future__ import annotations

import csv
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from fedcore.config import Config

__all__ = ["CSV_COLUMNS", "CSV_FILE", "TENSORBOARD_DIR", "Tracker", "make_tracker"]

TENSORBOARD_DIR = "tensorboard"
"""The folder, in a run's folder, of its TensorBoard event files."""
CSV_FILE = "rounds.csv"
"""The file, in a run's folder, of its round aggregates."""
CSV_COLUMNS = (
    "round",
    "train_loss",
    "nodes_up",
    "messages_sent",
    "bytes_sent",
    "messages_missing",
    "messages_dropped",
)
"""The columns of ``rounds.csv``: the keys of a ``"kind": "round"`` record."""


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a finite-or-not number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class Tracker:
    """Writes a run's TensorBoard events and/or ``rounds.csv`` as its rounds end."""

    def __init__(
        self,
        out: Path,
        *,
        tensorboard: bool,
        csv_rows: bool,
        config_text: str,
        first_round: int = 0,
    ) -> None:
        """Start tracking the run in ``out`` from round ``first_round`` (0: a new run, whose
        earlier tracking files, if any, are replaced; more: a resumed run, see the module
        docstring). ``config_text``: the effective config (TOML), logged as text."""
        self.out = out
        self._writer: Any = None
        self._csv_file: IO[str] | None = None
        self._csv: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            folder = out / TENSORBOARD_DIR
            if first_round == 0:
                shutil.rmtree(folder, ignore_errors=True)
                self._writer = SummaryWriter(str(folder), flush_secs=10)
                self._writer.add_text("config", "```toml\n" + config_text + "\n```", 0)
            else:
                self._writer = SummaryWriter(str(folder), flush_secs=10, purge_step=first_round)
        if csv_rows:
            path = out / CSV_FILE
            kept: list[str] = []
            if first_round > 0 and path.is_file():
                lines = path.read_text(encoding="utf-8").splitlines()
                kept = [ln for ln in lines[1:] if ln and int(ln.split(",", 1)[0]) < first_round]
            self._csv_file = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115 - closed in close()
            self._csv = csv.writer(self._csv_file, lineterminator="\n")
            self._csv.writerow(CSV_COLUMNS)
            for line in kept:
                self._csv_file.write(line + "\n")

    def round(self, record: Mapping[str, Any]) -> None:
        """A ``"kind": "round"`` record."""
        t = int(record["round"])
        if self._writer is not None:
            for key in CSV_COLUMNS[1:]:
                value = _number(record.get(key))
                self._writer.add_scalar(f"round/{key}", math.nan if value is None else value, t)
        if self._csv is not None:
            self._csv.writerow(["" if record.get(k) is None else record[k] for k in CSV_COLUMNS])

    def evaluation(self, record: Mapping[str, Any]) -> None:
        """A ``"kind": "eval"`` record (its per-node map is left out)."""
        self._scalars("eval", record)
        self.flush()

    def regret(self, record: Mapping[str, Any]) -> None:
        """A ``"kind": "regret"`` record."""
        self._scalars("regret", record)

    def _scalars(self, group: str, record: Mapping[str, Any]) -> None:
        if self._writer is None:
            return
        t = int(record["round"])
        for key, raw in record.items():
            value = _number(raw)
            if key != "round" and value is not None:
                self._writer.add_scalar(f"{group}/{key}", value, t)

    def flush(self) -> None:
        """Push what is buffered to the files (before a checkpoint, at evaluations)."""
        if self._writer is not None:
            self._writer.flush()
        if self._csv_file is not None:
            self._csv_file.flush()

    def close(self) -> None:
        """Flush and close the files (again: nothing)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = self._csv = None


def make_tracker(
    config: Config, out: Path, config_text: str, first_round: int = 0
) -> Tracker | None:
    """The tracker ``config`` asks for (``run.tensorboard``, ``run.csv``), or None."""
    if not (config.run.tensorboard or config.run.csv):
        return None
    return Tracker(
        out,
        tensorboard=config.run.tensorboard,
        csv_rows=config.run.csv,
        config_text=config_text,
        first_round=first_round,
    )
