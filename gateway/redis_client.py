"""The one way pdserve opens a Redis client: every call on it is bounded by `timeout_s`.

Connecting and waiting for each reply take at most `timeout_s`; past it the call raises
redis.TimeoutError (or ConnectionError). Replies are decoded to str.
"""
from __future__ import annotations

import redis.asyncio as redis


def connect_redis(url: str, *, timeout_s: float) -> redis.Redis:
    """A client for `url` (redis://host:port/db); connects lazily on the first call."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=True,
    )
