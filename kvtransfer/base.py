"""The sender interface every transport implements, and the checks all of them share.

`send` copies the prefill pool's blocks `block_ids` into the decode replica's reserved blocks
`target.block_ids` (same count, same order) and returns only after the decode replica has
acknowledged that the request's KV is complete. Before the first byte moves, the target's
layout must equal the sender's (`LayoutMismatchError`); any other failure is a `TransferError`,
a `PrefillKVError` where the sender's own KV is at fault.
A sender that `streams_layers` also takes `layers_ready` (the layer numbers, in order, as the
forward pass completes them) and starts sending before the last layer is computed.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from pdserve.engine.kv_cache import KVCacheMismatchError, KVCacheSpec
from pdserve.kvtransfer.layout import KVLayout, check_layout
from pdserve.kvtransfer.target import KVTarget
from pdserve.protocol.errors import PrefillKVError, TransferError


@dataclass(frozen=True, slots=True)
class TransferResult:
    num_bytes: int
    seconds: float
    transport: int  # common_pb2.Transport


class KVSender(Protocol):
    transport: int  # common_pb2.Transport
    streams_layers: bool

    async def send(
        self,
        request_id: str,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]
        block_ids: Sequence[int],
        target: KVTarget,
        layers_ready: AsyncIterator[int] | None = None,  # only where `streams_layers`
    ) -> TransferResult: ...

    async def close(self) -> None: ...


def validate_send(
    local_layout: KVLayout,
    request_id: str,
    kv_cache: torch.Tensor,
    block_ids: Sequence[int],
    target: KVTarget,
) -> None:
    """Everything a sender checks before it touches the decode replica."""
    check_layout(local_layout, target.layout, "prefill", "decode")
    if target.request_id and target.request_id != request_id:
        raise TransferError(f"KV target is for request {target.request_id!r}, not {request_id!r}")
    if len(block_ids) != len(target.block_ids):
        raise TransferError(
            f"request {request_id}: {len(block_ids)} prefill blocks for {len(target.block_ids)} "
            "reserved decode blocks"
        )
    try:
        KVCacheSpec.from_layout(local_layout).check(kv_cache)
    except KVCacheMismatchError as error:
        raise PrefillKVError(f"prefill side: {error}") from error
    num_local_blocks = kv_cache.shape[2]
    if any(not 0 <= block_id < num_local_blocks for block_id in block_ids):
        raise PrefillKVError(f"request {request_id}: prefill block ids outside [0, {num_local_blocks})")
