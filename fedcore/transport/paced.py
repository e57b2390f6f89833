"""A transport whose sends take the time ``[time]`` gives their links (:class:`PacedTransport`).

Every message waits ``latency + bytes / bandwidth`` real seconds of its link
(:meth:`fedcore.timing.TimeModel.transfer_seconds` of its encoded size) before it is handed
to the inner transport, so a peer's uplink carries one message at a time in strict mode
(sends one after another) and compression shows in time on real peers too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import torch

from fedcore.messages import Message
from fedcore.timing import TimeModel
from fedcore.transport.base import AsyncTransport, Transport, TransportStats

__all__ = ["PacedTransport"]


class PacedTransport:
    """``inner`` with each send delayed by its link's transfer time."""

    def __init__(self, inner: Transport, model: TimeModel) -> None:
        """Wrap ``inner`` (this node's endpoint)."""
        self.inner = inner
        self.model = model
        self.node_id = inner.node_id
        self.stats: TransportStats = inner.stats
        self._index = {v: i for i, v in enumerate(model.nodes)}

    def seconds(self, message: Message) -> float:
        """The transfer time of ``message`` on its link."""
        src = torch.tensor([self._index[message.sender]])
        dst = torch.tensor([self._index[message.receiver]])
        nbytes = torch.tensor([message.nbytes])
        return float(self.model.transfer_seconds(src, dst, nbytes)[0])

    async def send(self, message: Message) -> None:
        """Send ``message`` once its transfer time has passed."""
        wait = self.seconds(message)
        if wait > 0:
            await asyncio.sleep(wait)
        await self.inner.send(message)

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """The inner inbox."""
        return await self.inner.collect(round, phase, senders, timeout)

    def keep_newest(self) -> None:
        """Asynchronous peers: the inner transport keeps each sender's newest message."""
        _asynchronous(self.inner).keep_newest()

    def take(self, senders: Collection[str]) -> dict[str, Message]:
        """Asynchronous peers: the inner transport's newest messages."""
        taken: dict[str, Message] = _asynchronous(self.inner).take(senders)
        return taken

    async def wait_any(self, timeout: float | None) -> bool:
        """Asynchronous peers: wait for a message at the inner transport."""
        return bool(await _asynchronous(self.inner).wait_any(timeout))

    async def close(self) -> None:
        """Close the inner transport."""
        await self.inner.close()


def _asynchronous(inner: Transport) -> AsyncTransport:
    """``inner`` as an asynchronous peer's transport (every transport of fedcore is one)."""
    if not hasattr(inner, "take"):
        raise TypeError(f"{type(inner).__name__} cannot serve an asynchronous peer")
    return inner  # type: ignore[return-value]
