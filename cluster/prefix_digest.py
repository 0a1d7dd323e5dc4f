"""Which prompt prefixes each replica holds in its KV cache, published through Redis for routing.

    prefixes:{kind}:{replica_id}   string: the replica's newest cached block hashes
                                   (engine.block_hash), each cut to DIGEST_HASH_BYTES, as hex

A digest is bounded (at most MAX_DIGEST_HASHES hashes: 16 KiB) and has the TTL of the replica's
registry key, written with it by the heartbeat, so a dead replica's digest goes with it. The
gateway reads every digest at most once per `refresh_s`: routing pays one Redis round trip per
refresh, not per request. A digest lags its replica by up to a heartbeat plus a refresh, and is
not signed; a stale or forged one can only make a request land where its prefix is not cached
(the replica looks up its own cache on arrival), never send it to a replica not in the registry.
While Redis is unreachable the gateway routes on the digests it read last.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import redis.asyncio as redis

from pdserve.cluster.redis_client import StateStoreUnavailableError, state_store_errors

MAX_DIGEST_HASHES = 1024
DEFAULT_REFRESH_S = 1.0
DIGEST_HASH_BYTES = 8  # a 2^-64 chance that two different prefixes look alike: a misroute at worst
_HEX_CHARS = 2 * DIGEST_HASH_BYTES


def digest_key(kind: str, replica_id: str) -> str:
    return f"prefixes:{kind}:{replica_id}"


def encode_digest(block_hashes: Sequence[bytes]) -> str:
    return "".join(block_hash[:DIGEST_HASH_BYTES].hex() for block_hash in block_hashes[:MAX_DIGEST_HASHES])


def decode_digest(text: str) -> frozenset[str]:
    return frozenset(text[start:start + _HEX_CHARS] for start in range(0, len(text), _HEX_CHARS))


def num_cached_blocks(block_hashes: Sequence[bytes], digest: frozenset[str]) -> int:
    """How many leading blocks of a prompt (its block hashes, in order) a digest holds."""
    count = 0
    for block_hash in block_hashes:
        if block_hash[:DIGEST_HASH_BYTES].hex() not in digest:
            break
        count += 1
    return count


class PrefixDigests:
    """The gateway's side: every replica's digest, re-read at most once per `refresh_s`."""

    def __init__(self, client: redis.Redis, refresh_s: float = DEFAULT_REFRESH_S, clock: Callable[[], float] = time.monotonic):
        self._redis = client
        self._refresh_s = refresh_s
        self._clock = clock
        self._digests: dict[tuple[str, str], frozenset[str]] = {}
        self._read_at_s = -float("inf")

    async def get(self, replicas: Sequence[tuple[str, str]]) -> dict[tuple[str, str], frozenset[str]]:
        """Digests of `replicas` ((kind, replica_id) pairs); an empty one for a replica that has
        published none."""
        known = set(self._digests)
        if self._clock() - self._read_at_s >= self._refresh_s or not known.issuperset(replicas):
            keys = [digest_key(kind, replica_id) for kind, replica_id in replicas]
            try:
                with state_store_errors():
                    values = await self._redis.mget(keys) if keys else []
            except StateStoreUnavailableError:  # route on the digests read last, as on the replicas
                return {replica: self._digests.get(replica, frozenset()) for replica in replicas}
            self._digests = {replica: decode_digest(value or "") for replica, value in zip(replicas, values)}
            self._read_at_s = self._clock()
        return {replica: self._digests.get(replica, frozenset()) for replica in replicas}
