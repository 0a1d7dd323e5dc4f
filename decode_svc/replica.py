"""A decode replica: the engine, its shareable KV pool and the reservations on it.

1. Reserve: blocks are allocated for a prompt (at most the model's context length, and within
   the caller's cap on blocks held in reservations) and entered in the reservation table with a
   fresh write token, which only the caller learns, in the KVTarget.
2. Transfer: a prefill replica writes the prompt's KV into them (in place, or through the
   KVTransfer service), presenting the token, and the reservation is marked LANDED.
3. Generate: on a gateway's `DecodeSession`, the request joins the running batch with its
   first token; its tokens go out with the session's other requests, one message per step.
4. Finish / abort / session end / expiry: the engine frees the blocks, once no write into them
   is in progress or can start (decode_svc/reservations.py: fencing; the in-place transports'
   write fence over the pool's blocks is `self.fence`).

All engine access goes through `AsyncEngine`; the reservation table and the open sessions live
on the event loop. In flight, for a drain: every reservation not yet joined plus every request
some session still serves (running or waiting in the engine, or its last output not yet read).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pdserve.cluster.waiting_bound import DEFAULT_MAX_WAITING_REQUESTS
from pdserve.decode_svc.reservations import Reservation, ReservationTable
from pdserve.decode_svc.session import DecodeSession, ReplicaStoppingError
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.config import model_id
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.kvtransfer.layout import make_layout
from pdserve.kvtransfer.pool import KVPool
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.transports import create_kv_pool, target_fields
from pdserve.kvtransfer.write_fence import WriteFence
from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.kv_blocks import num_blocks_for
from pdserve.v1 import common_pb2

logger = logging.getLogger(__name__)
REAP_INTERVAL_S = 0.5
WRITE_TOKEN_BYTES = 16  # 128 bits
IN_PLACE_TRANSPORTS = (common_pb2.TRANSPORT_SHM, common_pb2.TRANSPORT_CUDA_IPC)


@dataclass(frozen=True, slots=True)
class DecodeReplicaConfig:
    engine: EngineConfig
    replica_id: str
    kv_endpoint: str  # host:port where prefill replicas reach this replica's KVTransfer service
    reservation_timeout_s: float = 30.0
    # Of the pool, the share one caller may hold in reservations not yet joined.
    max_reserved_fraction_per_caller: float = 0.5
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS  # prompts it prefills itself, queued, not yet started


class DecodeReplica:
    def __init__(self, config: DecodeReplicaConfig, loop: asyncio.AbstractEventLoop):
        self.config = config
        self.pool: KVPool | None = None
        # A CPU pool goes in shared memory so that same-host prefill replicas can write in place.
        engine = LLMEngine(config.engine, kv_allocator=self._allocate_pool, kv_pool_in_shared_memory=True)
        self.engine = AsyncEngine(engine, loop)
        self.layout = make_layout(model_id(config.engine.model), engine.kv_spec)
        self.max_model_len = engine.max_model_len
        self.block_size = engine.allocator.block_size
        self.fence = WriteFence(engine.allocator.num_blocks)
        self.reservations = ReservationTable(
            config.reservation_timeout_s, self.fence.try_close,
            max_blocks_per_caller=max(1, int(config.max_reserved_fraction_per_caller * engine.allocator.num_blocks)))
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
        self.fence.close()

    def engine_came_round_s(self) -> float:
        return self.engine.came_round_s

    def num_in_flight(self) -> int:
        return len(self.reservations) + sum(session.num_requests for session in self._sessions)

    async def load(self) -> dict[str, int]:
        """Figures for the replica registry, read on the engine thread between steps."""
        return await self.engine.call(lambda engine: engine.load())

    async def cached_prefix_hashes(self, limit: int) -> list[bytes]:
        return await self.engine.call(lambda engine: engine.cached_prefix_hashes(limit))

    async def reserve(self, request_id: str, num_prompt_tokens: int, transport: int, caller: str,
                      token_ids: list[int]) -> KVTarget:
        """Raises TransportUnavailableError, OutOfBlocksError, CallerQuotaError, InvalidRequestError.
        The prefill replica checks the target's layout against its own before the first byte moves."""
        if not 0 < num_prompt_tokens <= self.max_model_len:
            raise InvalidRequestError(
                f"num_prompt_tokens must be in [1, {self.max_model_len}] (the model's context length), "
                f"got {num_prompt_tokens}")
        pool_fields = target_fields(self.pool, transport)
        in_place = transport in IN_PLACE_TRANSPORTS
        self.reservations.check_quota(caller, num_blocks_for(num_prompt_tokens, self.block_size))
        table, num_cached = await self.engine.call(
            lambda engine: engine.reserve(request_id, num_prompt_tokens, token_ids))
        write_token = secrets.token_bytes(WRITE_TOKEN_BYTES)
        # Only the blocks after the cached prefix take writes; the shared ones are never written.
        entry = self.reservations.add(request_id, table[num_cached:], num_prompt_tokens, time.monotonic(),
                                      caller=caller, write_token=write_token, in_place=in_place)
        if in_place:
            pool_fields.update(fence_name=self.fence.name, fence_generation=self.fence.generation(entry.block_ids[0]))
        remaining_s = entry.deadline_s - time.monotonic()
        return KVTarget(
            request_id=request_id, block_ids=tuple(entry.block_ids), layout=self.layout, transport=transport,
            decode_replica=self.config.replica_id, kv_endpoint=self.config.kv_endpoint,
            deadline_unix_s=time.time() + remaining_s, write_token=write_token, num_cached_blocks=num_cached,
            **pool_fields)

    # The three methods below are the KVReceiver's view of the reservations.
    def begin_write(self, request_id: str, write_token: bytes) -> list[int]:
        return self.reservations.begin_write(request_id, write_token, time.monotonic())

    def end_write(self, request_id: str) -> None:
        ended = self.reservations.end_write(request_id)
        if ended is not None:
            self._release(ended, "ended during a KV write")

    def mark_landed(self, request_id: str, write_token: bytes, num_bytes: int) -> None:
        self.reservations.mark_landed(request_id, write_token, num_bytes, time.monotonic())

    @contextlib.contextmanager
    def session(self) -> Iterator[DecodeSession]:
        """A gateway's session, open while the block runs; leaving it aborts what still runs."""
        session = DecodeSession(self.engine, self.reservations, self.config.max_waiting_requests)
        self._sessions.add(session)
        try:
            yield session
        finally:
            self._sessions.discard(session)
            session.close()

    async def abort(self, request_id: str) -> bool:
        if not self.reservations.remove(request_id):
            return True  # a KV write still holds its blocks; they go back once none does
        return await self.engine.abort(request_id)

    async def _reap_expired(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            for entry in self.reservations.pop_ended(time.monotonic()):
                self._release(entry, f"ended ({entry.state.value})")

    def _release(self, entry: Reservation, why: str) -> None:
        logger.warning("reservation of %s %s; releasing %d blocks", entry.request_id, why, len(entry.block_ids))
        self.engine.submit(lambda engine: engine.release_kv(entry.request_id))

