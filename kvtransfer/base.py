"""The sender interface every transport implements, and the checks all of them share.

`send` copies the prefill pool's blocks `block_ids` into the decode replica's reserved blocks
`target.block_ids` (same count, same order) and returns only after the decode replica has
acknowledged that the request's KV is complete. Before the first byte moves, the target's
layout must equal the sender's (`LayoutMismatchError`); any other failure is a `TransferError`.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from kvtransfer.errors import TransferError
from kvtransfer.layout import check_layout, dtype_name
from pdserve.v1 import common_pb2, decode_pb2


@dataclass(frozen=True, slots=True)
class TransferResult:
    num_bytes: int
    seconds: float
    transport: int  # common_pb2.Transport


class KVSender(Protocol):
    async def send(
        self,
        request_id: str,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        block_ids: Sequence[int],
        target: decode_pb2.KVTarget,
    ) -> TransferResult: ...

    async def close(self) -> None: ...


def validate_send(
    local_layout: common_pb2.KVLayout,
    request_id: str,
    kv_cache: torch.Tensor,
    block_ids: Sequence[int],
    target: decode_pb2.KVTarget,
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
    expected_block_shape = (local_layout.block_size, local_layout.num_kv_heads, local_layout.head_dim)
    if (
        kv_cache.dim() != 6
        or kv_cache.shape[0] != local_layout.num_layers
        or kv_cache.shape[1] != 2
        or tuple(kv_cache.shape[3:]) != expected_block_shape
        or dtype_name(kv_cache.dtype) != local_layout.dtype
    ):
        raise TransferError(
            f"prefill pool {list(kv_cache.shape)} {dtype_name(kv_cache.dtype)} does not match its "
            f"own layout ({local_layout.num_layers} layers, blocks {list(expected_block_shape)}, "
            f"{local_layout.dtype})"
        )
    num_local_blocks = kv_cache.shape[2]
    if any(not 0 <= block_id < num_local_blocks for block_id in block_ids):
        raise TransferError(f"request {request_id}: prefill block ids outside [0, {num_local_blocks})")


def check_in_place_target(request_id: str, target: decode_pb2.KVTarget) -> None:
    """In-place transports write straight into decode memory: only into blocks that exist, and
    never after the reservation's deadline, when the blocks may already belong to someone else."""
    if any(block_id >= target.pool_num_blocks for block_id in target.block_ids):
        raise TransferError(
            f"request {request_id}: decode block ids outside the pool's {target.pool_num_blocks} blocks"
        )
    if target.deadline_unix_s and time.time() >= target.deadline_unix_s:
        raise TransferError(f"request {request_id}: the decode reservation expired before the transfer")


def decode_pool_shape(layout: common_pb2.KVLayout, num_blocks: int) -> tuple[int, ...]:
    return (layout.num_layers, 2, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)


def num_block_bytes(kv_cache: torch.Tensor, num_blocks: int) -> int:
    """Bytes of K and V, all layers, for `num_blocks` blocks of this pool."""
    per_block = kv_cache.shape[0] * 2 * kv_cache[0, 0, 0].numel() * kv_cache.element_size()
    return per_block * num_blocks
