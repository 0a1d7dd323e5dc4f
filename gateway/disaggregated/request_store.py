"""Request records in Redis, changed only along the lifecycle of gateway.front.request_state.

    req:{id}            hash: state, prompt_tokens, completion_tokens, prefill_replica,
                        decode_replica, transport, error, kv_bytes, kv_transfer_s, owner, created_unix_s
    req:{id}:history    list: "STATE@unix_s", one entry per state entered, oldest first

A transition reads the stored state, checks the move with `transition()` and writes the new
state, its history entry and any fields in one MULTI under WATCH, so of two writers racing from
the same state only one wins and the other sees the winner's state.

Every record has a TTL from its creation, so none outlives the gateway that drives it:
    live (non-terminal)   live_ttl_s, renewed by `keep_alive` for the requests a gateway still
                          drives (it calls it well inside live_ttl_s), so the records of a gateway
                          that crashed expire within live_ttl_s
    terminal              ttl_s, set by the transition into FINISHED, ABORTED or FAILED
`keep_alive` renews only records still live, in one script, so it never shortens or lengthens a
terminal record's ttl_s. Each Redis call is bounded by the socket timeouts of the client (see
cluster.redis_client); a Redis that cannot be reached raises StateStoreUnavailableError.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import redis.asyncio as redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from pdserve.cluster.redis_client import state_store_errors
from pdserve.gateway.front.request_state import RequestNotFoundError, RequestRecord, RequestState, transition
from pdserve.protocol.errors import IllegalTransitionError, InvalidConfigError, InvalidRequestError, PdserveError

# Retries of one WATCH transaction when another writer changed the request in between; each
# retry follows a winning writer, so this bounds how many writers can race on one request.
_MAX_ATTEMPTS = 32

# Renews the live TTL of each (record, history) key pair whose record is in one of the live states
# ARGV[2:]; returns how many it renewed. KEYS: record 1, history 1, record 2, history 2, ...
_KEEP_ALIVE_SCRIPT = """
local live = {}
for i = 2, #ARGV do live[ARGV[i]] = true end
local renewed = 0
for i = 1, #KEYS, 2 do
    local state = redis.call('HGET', KEYS[i], 'state')
    if state and live[state] then
        redis.call('PEXPIRE', KEYS[i], ARGV[1])
        redis.call('PEXPIRE', KEYS[i + 1], ARGV[1])
        renewed = renewed + 1
    end
end
return renewed
"""
_LIVE_STATES = tuple(state.name for state in RequestState if not state.is_terminal)

_FIELD_TYPES: dict[str, type] = {
    "prompt_tokens": int,
    "completion_tokens": int,
    "prefill_replica": str,
    "decode_replica": str,
    "transport": str,  # the transport actually used, as kvtransfer names it ("shm", "grpc", ...)
    "error": str,
    "kv_bytes": int,
    "kv_transfer_s": float,
    "owner": str,  # the fingerprint of the creating caller's API key (gateway.front.api_keys), never the key
}


class RequestExistsError(InvalidRequestError):
    """A request id that is already in use was given to a new request."""


class StoreContentionError(PdserveError, RuntimeError):
    """A request kept changing under a transaction until it gave up."""


class RequestStore:
    def __init__(self, client: redis.Redis, *, ttl_s: float = 3600.0, live_ttl_s: float = 60.0):
        """`client` must decode replies (cluster.redis_client.connect_redis makes one)."""
        if ttl_s <= 0 or live_ttl_s <= 0:
            raise InvalidConfigError(f"ttl_s and live_ttl_s must be positive, got {ttl_s} and {live_ttl_s}")
        self._redis = client
        self._ttl_ms = round(ttl_s * 1000)
        self.live_ttl_s = live_ttl_s
        self._live_ttl_ms = round(live_ttl_s * 1000)
        self._keep_alive = client.register_script(_KEEP_ALIVE_SCRIPT)

    async def create(self, request_id: str, prompt_tokens: int, owner: str = "") -> None:
        """Records a new request in QUEUED; raises RequestExistsError if the id is taken."""
        key = _key(request_id)

        async def body(pipe: Pipeline) -> None:
            if await pipe.exists(key):
                raise RequestExistsError(f"request id {request_id!r} is already in use")
            now_unix_s = time.time()
            pipe.multi()
            pipe.hset(key, mapping=_encode(_initial_fields(prompt_tokens, now_unix_s) | {"owner": owner}))
            pipe.rpush(_history_key(request_id), _history_entry(RequestState.QUEUED, now_unix_s))
            pipe.pexpire(key, self._live_ttl_ms)
            pipe.pexpire(_history_key(request_id), self._live_ttl_ms)

        await self._atomically(key, body)

    async def keep_alive(self, request_ids: list[str]) -> int:
        """Renews live_ttl_s on the records of `request_ids` still live; returns how many."""
        if not request_ids:
            return 0
        keys = [key for request_id in request_ids for key in (_key(request_id), _history_key(request_id))]
        with state_store_errors():
            return await self._keep_alive(keys=keys, args=[self._live_ttl_ms, *_LIVE_STATES])

    async def transition(self, request_id: str, to_state: RequestState, **fields: int | float | str) -> None:
        """Moves the request to `to_state` and sets `fields` with it, or raises
        IllegalTransitionError and changes nothing."""
        key = _key(request_id)
        mapping = _encode(_checked(fields))

        async def body(pipe: Pipeline) -> None:
            stored = await pipe.hget(key, "state")
            if stored is None:
                raise RequestNotFoundError(f"request {request_id!r} not found")
            try:
                transition(RequestState[stored], to_state)
            except IllegalTransitionError as error:
                raise IllegalTransitionError(f"request {request_id!r}: {error}") from None
            pipe.multi()
            pipe.hset(key, mapping={**mapping, "state": to_state.name})
            pipe.rpush(_history_key(request_id), _history_entry(to_state, time.time()))
            if to_state.is_terminal:
                pipe.pexpire(key, self._ttl_ms)
                pipe.pexpire(_history_key(request_id), self._ttl_ms)

        await self._atomically(key, body)

    async def update(self, request_id: str, **fields: int | float | str) -> None:
        """Sets fields other than the state; raises RequestNotFoundError for an unknown request."""
        key = _key(request_id)
        mapping = _encode(_checked(fields))

        async def body(pipe: Pipeline) -> None:
            if not await pipe.exists(key):
                raise RequestNotFoundError(f"request {request_id!r} not found")
            pipe.multi()
            pipe.hset(key, mapping=mapping)

        if mapping:
            await self._atomically(key, body)

    async def get(self, request_id: str) -> RequestRecord | None:
        with state_store_errors():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(_key(request_id))
                pipe.lrange(_history_key(request_id), 0, -1)
                stored, history = await pipe.execute()
        if not stored:
            return None
        return RequestRecord(
            request_id=request_id,
            state=RequestState[stored["state"]],
            **{name: kind(stored[name]) for name, kind in _FIELD_TYPES.items()},
            created_unix_s=float(stored["created_unix_s"]),
            history=tuple(_parse_history_entry(entry) for entry in history),
        )

    async def _atomically(self, key: str, body: Callable[[Pipeline], Awaitable[None]]) -> None:
        """Runs `body` (reads, then `pipe.multi()` and queued writes) under WATCH on `key`,
        again from the start whenever another writer changed `key` before EXEC."""
        for _ in range(_MAX_ATTEMPTS):
            try:
                with state_store_errors():
                    async with self._redis.pipeline(transaction=True) as pipe:
                        await pipe.watch(key)
                        await body(pipe)
                        await pipe.execute()
                        return
            except WatchError:  # another writer won; a lost connection raised StateStoreUnavailableError
                continue
        raise StoreContentionError(f"{key} changed under {_MAX_ATTEMPTS} transactions in a row")


def _key(request_id: str) -> str:
    return f"req:{request_id}"


def _history_key(request_id: str) -> str:
    return f"req:{request_id}:history"


def _initial_fields(prompt_tokens: int, now_unix_s: float) -> dict[str, int | float | str]:
    fields = {name: kind() for name, kind in _FIELD_TYPES.items()}
    fields.update(state=RequestState.QUEUED.name, prompt_tokens=prompt_tokens, created_unix_s=now_unix_s)
    return fields


def _checked(fields: dict[str, int | float | str]) -> dict[str, int | float | str]:
    for name, value in fields.items():
        kind = _FIELD_TYPES.get(name)
        if kind is None:
            raise TypeError(f"not a settable request field: {name!r}")
        accepted = (int, float) if kind is float else kind
        if not isinstance(value, accepted) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"request field {name!r} takes {kind.__name__}, got {value!r}")
    return fields


def _encode(fields: dict[str, int | float | str]) -> dict[str, str]:
    return {name: repr(float(value)) if isinstance(value, float) else str(value) for name, value in fields.items()}


def _history_entry(state: RequestState, unix_s: float) -> str:
    return f"{state.name}@{unix_s!r}"


def _parse_history_entry(entry: str) -> tuple[RequestState, float]:
    name, unix_s = entry.split("@")
    return RequestState[name], float(unix_s)
