"""Real peers slowed on purpose: ``[time]`` applied as real sleeps (:class:`Pace`).

A gRPC peer (``fedcore node``, ``fedcore launch``) whose config has ``[time]`` waits, in
wall-clock seconds, what a simulation would count in virtual ones: before it computes, until
it is available (its on/off periods or availability trace, from the moment it started);
after it computed its local steps, the rest of their drawn seconds (a step that already took
longer than its draw waits nothing). Its sends are slowed by
:class:`~fedcore.transport.paced.PacedTransport`. So a local launch shows what stragglers,
slow links and peers that come and go do to a run, with the durations of the simulation
(the same keyed draws: the same peer is slow, the same step takes long).
"""

from __future__ import annotations

import asyncio
import time

import torch

from fedcore.timing import TimeModel

__all__ = ["Pace"]


class Pace:
    """One peer's real-time pacing from a :class:`~fedcore.timing.TimeModel`."""

    def __init__(self, model: TimeModel, node: str, *, steps: int) -> None:
        """Pace ``node`` (one of the model's nodes), ``steps`` local steps a round."""
        self.model = model
        self.index = torch.tensor([model.nodes.index(node)])
        self.steps = steps
        self.taken = 0  # local steps so far: the step coordinate of the draws
        self.began = time.monotonic()
        self.slept = 0.0
        """Seconds this peer slept so far (for its log)."""

    async def available(self) -> None:
        """Wait until the peer is on (from when it started)."""
        now = time.monotonic() - self.began
        at = torch.tensor([now], dtype=torch.float64)
        wait = float(self.model.available_from(self.index, at)[0]) - now
        await self._sleep(wait)

    async def computed(self, elapsed: float) -> None:
        """The peer computed its round's local steps in ``elapsed`` real seconds: wait the
        rest of what they take in ``[time]``."""
        first = torch.tensor([self.taken])
        seconds = float(self.model.compute_seconds(self.index, first, self.steps)[0])
        self.taken += self.steps
        await self._sleep(seconds - elapsed)

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.slept += seconds
            await asyncio.sleep(seconds)
