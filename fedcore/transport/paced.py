"""A transport whose sends take the time ``[time]`` gives their links (:class:`PacedTransport`).

Every message waits ``latency + bytes / bandwidth`` real seconds of its link
(:meth:`fedcore.timing.TimeModel.transfer_seconds` of its encoded size) before it is handed
to the inner transport, so a peer's uplink carries one message at a time in strict mode
(sends one after another) and compression shows in time on real peers too.
"""

from __future__ import annotations

import asyncio

import torch

from fedcore.messages import Message
from fedcore.timing import TimeModel
from fedcore.transport.base import Transport, TransportWrapper

__all__ = ["PacedTransport"]


class PacedTransport(TransportWrapper):
    """``inner`` with each send delayed by its link's transfer time."""

    def __init__(self, inner: Transport, model: TimeModel) -> None:
        """Wrap ``inner`` (this node's endpoint)."""
        super().__init__(inner)
        self.model = model
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
