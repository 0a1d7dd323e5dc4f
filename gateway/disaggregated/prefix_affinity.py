"""How much of a prompt each replica already holds in its prefix cache, as its digest says.

A replica finds a cached prefix by the chained hashes of the prompt's full blocks
(engine.block_hash) and publishes the hashes it holds (cluster.prefix_digest). Here the gateway
hashes the prompt the same way and counts, per replica, the leading blocks its digest holds:
the prompt tokens that replica would not compute (prefill) or receive (decode). At most all but
the last token count, as the engine computes that one itself. The count is a forecast from a
digest up to a heartbeat old; the router weighs it against load, and the replica decides.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pdserve.cluster.prefix_digest import PrefixDigests, num_cached_blocks
from pdserve.protocol.kv_blocks import block_hashes

if TYPE_CHECKING:
    from pdserve.cluster.registry import ReplicaInfo

class PrefixAffinity:
    def __init__(self, digests: PrefixDigests | None):
        """`digests` None: load-only routing, every replica holds nothing."""
        self._digests = digests

    async def cached_tokens(self, replicas: Sequence[ReplicaInfo], token_ids: list[int]) -> dict[str, dict[str, int]]:
        """{kind: {replica_id: prompt tokens its cache holds}}, for the replicas that hold any."""
        cached: dict[str, dict[str, int]] = {"prefill": {}, "decode": {}}
        if self._digests is None or not replicas or len(token_ids) < 2:
            return cached
        digests = await self._digests.get([(replica.kind, replica.replica_id) for replica in replicas])
        hashes_by_block_size: dict[int, list[bytes]] = {}
        for replica in replicas:
            block_size = replica.block_size
            if not block_size:
                continue
            if block_size not in hashes_by_block_size:
                hashes_by_block_size[block_size] = block_hashes(token_ids[:-1], block_size)
            num_blocks = num_cached_blocks(hashes_by_block_size[block_size], digests[(replica.kind, replica.replica_id)])
            if num_blocks:
                cached[replica.kind][replica.replica_id] = num_blocks * block_size
        return cached
