"""The one way pdserve opens a Redis client: every call on it is bounded by `timeout_s`.

Connecting and each reply wait at most `timeout_s` (redis-py retries a failed call a few times
with backoff, so one call is bounded by a small multiple of it). Replies are decoded to str.
The pool holds at most `max_connections`; under a burst, a call waits up to `timeout_s` for a
free connection instead of failing.
"""
from __future__ import annotations

import redis.asyncio as redis

DEFAULT_MAX_CONNECTIONS = 64


def connect_redis(url: str, *, timeout_s: float, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> redis.Redis:
    """A client for `url` (redis://host:port/db); connects lazily on the first call."""
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=True,
    )
    return redis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it
