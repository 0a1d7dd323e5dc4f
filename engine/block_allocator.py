"""Paged KV block allocator: pure bookkeeping, no tensors.

Each request owns a block table (list of block ids); token `pos` of the request lives in block
`table[pos // block_size]` at offset `pos % block_size`. A block belongs to one table at a
time and goes back to the free list when its request is freed.

Invariant: `num_free_blocks + sum(len(table) for every table) == num_blocks`, and after every
request is freed, `num_free_blocks == num_blocks`.
"""
from __future__ import annotations

from collections import deque

from engine.errors import ResourceExhaustedError


class OutOfBlocksError(ResourceExhaustedError):
    """The pool has fewer free blocks than the allocation needs."""


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def num_new_blocks(self, request_id: str, num_tokens: int) -> int:
        """Blocks that must be taken from the pool for the request to hold `num_tokens` tokens."""
        num_owned = len(self._tables.get(request_id, ()))
        return max(0, num_blocks_for(num_tokens, self.block_size) - num_owned)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        return self.num_new_blocks(request_id, num_tokens) <= len(self._free)

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        """Grows the request's table to hold `num_tokens` tokens; returns the full table."""
        num_new = self.num_new_blocks(request_id, num_tokens)
        if num_new > len(self._free):
            raise OutOfBlocksError(f"request {request_id} needs {num_new} blocks, {len(self._free)} free")
        table = self._tables.setdefault(request_id, [])
        table.extend(self._free.popleft() for _ in range(num_new))
        return table

    def free(self, request_id: str) -> None:
        """Returns the request's blocks; unknown ids are ignored so abort paths can call it twice."""
        self._free.extend(reversed(self._tables.pop(request_id, [])))
