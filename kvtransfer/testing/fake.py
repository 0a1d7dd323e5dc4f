"""An in-memory KV sender/receiver pair, for unit tests of the services that use them.

The fake sender runs the same checks as the real ones (layout, block counts) and hands a copy
of the blocks, with the target's write token, to the fake receiver, which refuses requests its
reservations do not hold (or hold under another token) and then marks them landed, as a
decode replica would. `fail_with` makes the next sends fail.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.base import TransferResult, validate_send
from pdserve.kvtransfer.layout import KVLayout, check_layout
from pdserve.kvtransfer.receiver import ReservationView
from pdserve.kvtransfer.target import KVTarget
from pdserve.protocol.errors import PdserveError, TransferError
from pdserve.v1 import common_pb2


class FakeKVReceiver:
    def __init__(self, local_layout: KVLayout, reservations: ReservationView):
        self._layout = local_layout
        self._reservations = reservations
        # request id -> its KV, [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        self.received: dict[str, torch.Tensor] = {}

    def accept(self, request_id: str, layout: KVLayout, blocks: torch.Tensor, write_token: bytes) -> None:
        check_layout(self._layout, layout, "decode", "prefill")
        try:
            reserved = self._reservations.begin_write(request_id, write_token)
        except PdserveError as error:
            raise TransferError(str(error)) from error
        try:
            if len(reserved) != blocks.shape[2]:
                raise TransferError(f"request {request_id}: {blocks.shape[2]} blocks for {len(reserved)} reserved")
            self.received[request_id] = blocks
        finally:
            self._reservations.end_write(request_id)
        self._reservations.mark_landed(request_id, write_token, blocks.numel() * blocks.element_size())


class FakeKVSender:
    streams_layers = False

    def __init__(
        self,
        receiver: FakeKVReceiver,
        local_layout: KVLayout,
        transport: int = common_pb2.TRANSPORT_GRPC,
    ):
        self._receiver = receiver
        self._layout = local_layout
        self.transport = transport
        self.fail_with: Exception | None = None

    async def send(
        self,
        request_id: str,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        block_ids: Sequence[int],
        target: KVTarget,
        layers_ready: None = None,
    ) -> TransferResult:
        start_s = time.perf_counter()
        validate_send(self._layout, request_id, kv_cache, block_ids, target)
        if self.fail_with is not None:
            raise self.fail_with
        index = torch.tensor(list(block_ids), dtype=torch.long, device=kv_cache.device)
        self._receiver.accept(request_id, self._layout, kv_cache.index_select(2, index).cpu(), target.write_token)
        return TransferResult(
            num_bytes=len(block_ids) * KVCacheSpec.from_layout(self._layout).bytes_per_block,
            seconds=time.perf_counter() - start_s,
            transport=self.transport,
        )

    async def close(self) -> None:
        pass
