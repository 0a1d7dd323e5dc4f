"""Hands a request's KV to a streaming sender layer by layer, while the forward pass runs.

The engine thread announces "layer i of request r is complete" (through the event loop); on the
first announcement the push starts, and it sends each layer as soon as it is announced. The
push is an asyncio task the request awaits after its first token.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine

from pdserve.kvtransfer.base import TransferResult


class LayerFeed:
    def __init__(self, num_layers: int, timeout_s: float):
        self.num_layers = num_layers
        self.timeout_s = timeout_s
        self.push: asyncio.Task[TransferResult] | None = None
        self._layers: asyncio.Queue[int] = asyncio.Queue()

    def announce(self, block_ids: list[int], layer: int,
                 start_push: Callable[[list[int], AsyncIterator[int]], Coroutine]) -> None:
        if self.push is None:
            self.push = asyncio.get_running_loop().create_task(start_push(block_ids, self._announced()))
        self._layers.put_nowait(layer)

    def cancel(self) -> None:
        if self.push is None:
            return
        if self.push.done():
            if not self.push.cancelled():
                self.push.exception()  # retrieved: the request's own await reports it
        else:
            self.push.cancel()

    async def _announced(self) -> AsyncIterator[int]:
        for _ in range(self.num_layers):
            yield await asyncio.wait_for(self._layers.get(), self.timeout_s)
