"""Content hashes of full KV blocks, chained so that a block's hash names its whole prefix.

    hash(block 0) = H(b"" ‖ tokens of block 0)
    hash(block i) = H(hash(block i-1) ‖ tokens of block i)      H = blake2b, 16 bytes

Tokens are hashed as int32 little-endian. Two token sequences give block i the same hash only if
their first (i + 1) * block_size tokens are equal (up to a 2^-128 collision), so one hash stands for
the KV of a whole prefix. The hash depends on nothing but the tokens: equal on every replica of
one model and block size, which is what lets the gateway compare replicas' caches.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

BlockHash = bytes
HASH_BYTES = 16


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    tokens = np.asarray(token_ids, dtype="<i4").tobytes()
    return hashlib.blake2b(parent + tokens, digest_size=HASH_BYTES).digest()


def extend_block_hashes(hashes: list[BlockHash], tokens: Callable[[int, int], Sequence[int]],
                        num_blocks: int, block_size: int) -> list[BlockHash]:
    """Extends `hashes` (those of the first len(hashes) blocks) to the first `num_blocks` blocks;
    `tokens(start, stop)` gives token ids [start, stop). Returns those `num_blocks` hashes."""
    while len(hashes) < num_blocks:
        start = len(hashes) * block_size
        hashes.append(hash_block(hashes[-1] if hashes else b"", tokens(start, start + block_size)))
    return hashes if len(hashes) == num_blocks else hashes[:num_blocks]


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """The hash of every full block of `token_ids`."""
    return extend_block_hashes([], lambda start, stop: token_ids[start:stop], len(token_ids) // block_size, block_size)
