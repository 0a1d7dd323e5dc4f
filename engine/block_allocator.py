"""Paged KV block allocator with automatic prefix caching: pure bookkeeping, no tensors.

Each request owns a block table (list of block ids); token `pos` of the request lives in block
`table[pos // block_size]` at offset `pos % block_size`. A block is in one of three conditions:

    owned    ref_count > 0: in the tables of ref_count requests
    cached   ref_count == 0 with a hash: free, its KV kept for a later request with that prefix
    empty    ref_count == 0, no hash

A full block whose KV is computed is registered under its prefix hash (engine.block_hash) by
`cache_blocks`; a new table may start with cached or owned blocks of the same prefix
(`lookup`), which it then shares. Free blocks are reused empty ones first, then cached ones
least recently freed first; reuse drops the hash. With caching disabled no block gets a hash.

Invariants: `num_free_blocks + #owned blocks == num_blocks`; after every request is freed,
`num_free_blocks == num_blocks`. A hashed block is never written: a table writes only at
positions past those it has computed, and a shared or hashed block holds only computed,
full-block positions (the scheduler computes at least one token of every request itself).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from pdserve.protocol.errors import ResourceExhaustedError
from pdserve.protocol.kv_blocks import BlockHash, num_blocks_for


class OutOfBlocksError(ResourceExhaustedError):
    """The pool has fewer free blocks than the allocation needs."""


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref_counts = [0] * num_blocks
        self._hashes: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}  # prefix hash → the block holding its KV
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # next to reuse first
        self._tables: dict[str, list[int]] = {}
        self._num_registered: dict[str, int] = {}  # leading blocks of a table that carry a hash

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def cached_hashes(self, limit: int) -> list[BlockHash]:
        """Up to `limit` hashes of blocks whose KV is kept, the most recently registered first."""
        newest_first = reversed(self._cached)
        return [block_hash for block_hash, _ in zip(newest_first, range(limit))]

    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def lookup(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """The cached or owned blocks holding the longest prefix of `block_hashes`."""
        blocks = []
        for block_hash in block_hashes:
            block = self._cached.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def num_new_blocks(self, request_id: str, num_tokens: int, prefix: Sequence[int] = ()) -> int:
        """Free blocks the request takes to hold `num_tokens` tokens. A new table starts with the
        blocks `prefix` (from `lookup`; ignored for a table that exists), free ones among them
        counted as taken."""
        table = self._tables.get(request_id)
        if table is not None:
            return max(0, num_blocks_for(num_tokens, self.block_size) - len(table))
        num_reclaimed = sum(1 for block in prefix if self._ref_counts[block] == 0)
        return max(0, num_blocks_for(num_tokens, self.block_size) - len(prefix)) + num_reclaimed

    def can_allocate(self, request_id: str, num_tokens: int, prefix: Sequence[int] = ()) -> bool:
        return self.num_new_blocks(request_id, num_tokens, prefix) <= len(self._free)

    def allocate(self, request_id: str, num_tokens: int, prefix: Sequence[int] = ()) -> list[int]:
        """Grows the request's table to hold `num_tokens` tokens; a new table starts with the
        shared blocks `prefix`. Returns the full table."""
        num_new = self.num_new_blocks(request_id, num_tokens, prefix)
        if num_new > len(self._free):
            raise OutOfBlocksError(f"request {request_id} needs {num_new} blocks, {len(self._free)} free")
        table = self._tables.get(request_id)
        if table is None:
            table = self._tables[request_id] = []
            for block in prefix:
                self._share(block)
            table.extend(prefix)
            self._num_registered[request_id] = len(prefix)
        while len(table) < num_blocks_for(num_tokens, self.block_size):
            table.append(self._take_free())
        return table

    def cache_blocks(self, request_id: str, block_hashes: Sequence[BlockHash]) -> None:
        """Registers the request's leading blocks under `block_hashes`: their KV is computed. A
        hash another block already holds leaves this block unregistered (it stays private)."""
        if not self.enable_caching:
            return
        table = self._tables[request_id]
        for index in range(self._num_registered[request_id], len(block_hashes)):
            block, block_hash = table[index], block_hashes[index]
            if block_hash not in self._cached and self._hashes[block] is None:
                self._hashes[block] = block_hash
                self._cached[block_hash] = block
        self._num_registered[request_id] = max(self._num_registered[request_id], len(block_hashes))

    def free(self, request_id: str) -> None:
        """Drops the request's hold on its blocks; unknown ids are ignored so abort paths can
        call it twice. The table's last blocks are the first reused among its cached ones."""
        self._num_registered.pop(request_id, None)
        for block in reversed(self._tables.pop(request_id, [])):
            self._ref_counts[block] -= 1
            if self._ref_counts[block] == 0:
                self._free[block] = None
                if self._hashes[block] is None:
                    self._free.move_to_end(block, last=False)

    def _share(self, block: int) -> None:
        if self._ref_counts[block] == 0:
            del self._free[block]
        self._ref_counts[block] += 1

    def _take_free(self) -> int:
        block, _ = self._free.popitem(last=False)
        block_hash = self._hashes[block]
        if block_hash is not None:
            del self._cached[block_hash]
            self._hashes[block] = None
        self._ref_counts[block] = 1
        return block
