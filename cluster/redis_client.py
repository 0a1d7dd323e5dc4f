"""The one way pdserve opens a Redis client: every call on it is bounded by `timeout_s`, once
it holds a connection.

Connecting and each reply wait at most `timeout_s` (redis-py retries a failed call a few times
with backoff, so one call is bounded by a small multiple of it). Replies are decoded to str.
The pool holds at most `max_connections`. Under a burst, calls queue for a free connection for
up to `pool_wait_s`, a deadline of its own: how long the queue is depends on the load (a
thousand streams keep every connection busy for seconds), not on how fast Redis answers, so it
is far longer than `timeout_s` and load makes calls wait instead of failing.

A Redis that cannot be reached (refused, reset, timed out, still loading after a restart) is a
`StateStoreUnavailableError`, an engine.errors.UnavailableError: the modules that own a Redis
boundary (the request store, the registry) wrap their calls in `state_store_errors()`, so a
front reports it as HTTP 503 / gRPC UNAVAILABLE, never as a bug.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from pdserve.protocol.errors import UnavailableError

DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_POOL_WAIT_S = 60.0


def connect_redis(
    url: str, *, timeout_s: float, max_connections: int = DEFAULT_MAX_CONNECTIONS,
    pool_wait_s: float = DEFAULT_POOL_WAIT_S,
) -> redis.Redis:
    """A client for `url` (redis://host:port/db); connects lazily on the first call."""
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_wait_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=True,
    )
    return redis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


_UNREACHABLE = (RedisConnectionError, RedisTimeoutError)


class StateStoreUnavailableError(UnavailableError):
    """Redis, which holds request records and the replica registry, cannot be reached now."""


@contextlib.contextmanager
def state_store_errors() -> Iterator[None]:
    """Raises StateStoreUnavailableError for a Redis that cannot be reached inside the block,
    including a connection lost under WATCH, which redis-py raises as a WatchError."""
    try:
        yield
    except _UNREACHABLE as exc:
        raise StateStoreUnavailableError(f"the state store (Redis) is unreachable: {exc}") from exc
    except WatchError as exc:
        if not isinstance(exc.__context__, _UNREACHABLE):
            raise  # another writer changed a watched key: the caller retries
        raise StateStoreUnavailableError(f"the state store (Redis) is unreachable: {exc.__context__}") from exc
