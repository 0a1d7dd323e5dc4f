"""A decode replica: the engine, its shareable KV pool and the reservations on it.

1. Reserve: blocks are allocated for a prompt and entered in the reservation table.
2. Transfer: a prefill replica writes the prompt's KV into them (in place, or through the
   KVTransfer service) and the reservation is marked LANDED.
3. Generate: on a gateway's `DecodeSession`, the request joins the running batch with its
   first token; its tokens go out with the session's other requests, one message per step.
4. Finish / abort / session end / expiry: the engine frees the blocks.

All engine access goes through `AsyncEngine`; the reservation table and the open sessions live
on the event loop. In flight, for a drain: every reservation not yet joined plus every request
some session still serves (running or waiting in the engine, or its last output not yet read).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from decode_svc.reservations import ReservationTable
from decode_svc.session import DecodeSession, ReplicaStoppingError
from engine.async_engine import AsyncEngine
from engine.config import model_id
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from kvtransfer.layout import make_layout
from kvtransfer.pool import KVPool
from kvtransfer.target import KVTarget
from kvtransfer.transports import create_kv_pool, target_fields

logger = logging.getLogger(__name__)
REAP_INTERVAL_S = 0.5


@dataclass(frozen=True, slots=True)
class DecodeReplicaConfig:
    engine: EngineConfig
    replica_id: str
    kv_endpoint: str  # host:port where prefill replicas reach this replica's KVTransfer service
    reservation_timeout_s: float = 30.0


class DecodeReplica:
    def __init__(self, config: DecodeReplicaConfig, loop: asyncio.AbstractEventLoop):
        self.config = config
        self.pool: KVPool | None = None
        # A CPU pool goes in shared memory so that same-host prefill replicas can write in place.
        engine = LLMEngine(config.engine, kv_allocator=self._allocate_pool)
        self.engine = AsyncEngine(engine, loop)
        self.layout = make_layout(model_id(config.engine.model), engine.kv_spec)
        self.reservations = ReservationTable(config.reservation_timeout_s)
        self._reaper: asyncio.Task | None = None
        self._sessions: set[DecodeSession] = set()

    def _allocate_pool(self, spec, num_blocks, device):
        self.pool = create_kv_pool(spec, num_blocks, device, shared=True)
        return self.pool.tensor

    def start(self) -> None:
        self.engine.start()
        self._reaper = asyncio.get_running_loop().create_task(self._reap_expired())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for session in list(self._sessions):
            session.close(ReplicaStoppingError(f"decode replica {self.config.replica_id} is stopping"))
        await self.engine.stop()
        self.pool.close()

    def num_in_flight(self) -> int:
        return len(self.reservations) + sum(session.num_requests for session in self._sessions)

    async def load(self) -> dict[str, int]:
        """Figures for the replica registry, read on the engine thread between steps."""
        return await self.engine.call(lambda engine: engine.load())

    async def cached_prefix_hashes(self, limit: int) -> list[bytes]:
        return await self.engine.call(lambda engine: engine.cached_prefix_hashes(limit))

    async def reserve(self, request_id: str, num_prompt_tokens: int, transport: int,
                      token_ids: list[int]) -> KVTarget:
        """Raises TransportUnavailableError, OutOfBlocksError, InvalidRequestError. The prefill
        replica checks the target's layout against its own before the first byte moves."""
        pool_fields = target_fields(self.pool, transport)
        table, num_cached = await self.engine.call(lambda engine: engine.reserve(request_id, num_prompt_tokens, token_ids))
        # Only the blocks after the cached prefix take writes; the shared ones are never written.
        entry = self.reservations.add(request_id, table[num_cached:], num_prompt_tokens, time.monotonic())
        remaining_s = entry.deadline_s - time.monotonic()
        return KVTarget(
            request_id=request_id, block_ids=tuple(entry.block_ids), layout=self.layout, transport=transport,
            decode_replica=self.config.replica_id, kv_endpoint=self.config.kv_endpoint,
            deadline_unix_s=time.time() + remaining_s, num_cached_blocks=num_cached, **pool_fields)

    # The two methods below are the KVReceiver's view of the reservations.
    def block_ids(self, request_id: str) -> list[int] | None:
        return self.reservations.writable_block_ids(request_id)

    def mark_landed(self, request_id: str, num_bytes: int) -> None:
        self.reservations.mark_landed(request_id, num_bytes, time.monotonic())

    @contextlib.contextmanager
    def session(self) -> Iterator[DecodeSession]:
        """A gateway's session, open while the block runs; leaving it aborts what still runs."""
        session = DecodeSession(self.engine, self.reservations)
        self._sessions.add(session)
        try:
            yield session
        finally:
            self._sessions.discard(session)
            session.close()

    async def abort(self, request_id: str) -> bool:
        self.reservations.remove(request_id)
        return await self.engine.abort(request_id)

    async def _reap_expired(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            for entry in self.reservations.pop_expired(time.monotonic()):
                logger.warning("reservation of %s expired (%s); releasing %d blocks",
                               entry.request_id, entry.state.value, len(entry.block_ids))
                self.engine.submit(lambda engine, rid=entry.request_id: engine.release_kv(rid))

