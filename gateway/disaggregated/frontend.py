"""The `Frontend` contract over a disaggregated deployment: each request runs through a decode
replica, and through a prefill replica unless its decode replica prefills it itself.

`generate` tokenizes the request, fits its parameters and hands it to a `DisaggregatedRequest`
(gateway.disaggregated.request), which drives it through its states and calls `route` for each
attempt. `route` puts the attempt in the gateway's line (gateway.disaggregated.prefill_line) and
returns once the dispatcher placed it: decode = most free KV blocks, prefill = fewest queued
prompt tokens, each counting the prompt's blocks it holds cached in its favour
(gateway.disaggregated.router); remote or local prefill, or wait, by
gateway.disaggregated.prefill_placement; the KV transport from both replicas' host and device
unless the config forces one. For a remote prefill it then reserves the decode blocks, right
before the prompt goes to prefill; a decode replica out of blocks (or past this gateway's cap)
sends the attempt back to the line, in its place, until a request ends. So a burst queues in
the gateway and is never refused for want of blocks: only admission's bound refuses (429).

Invariants: a request is live here (found by `abort`, its Redis record's TTL renewed by
`keep_records_alive`) from the moment it is prepared until its stream closes, so the record of
a request no gateway drives any more expires. The dispatcher places waiters one at a time with
no await between a pick and counting it against the replica's load (the router's pending
dispatches, the ledger's backlog), so each pick sees every dispatch this gateway made before it;
every placement's dispatch is taken off the ledger exactly once (`PrefillTicket.done`).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.redis_client import StateStoreUnavailableError
from pdserve.cluster.registry import LiveReplicas, ReplicaInfo
from pdserve.gateway.disaggregated.backend_errors import BackendError
from pdserve.gateway.disaggregated.channels import ChannelPool
from pdserve.gateway.disaggregated.completion_text import CompletionText
from pdserve.gateway.disaggregated.migration import Migrations
from pdserve.gateway.disaggregated.prefill_line import PrefillLine, Waiter
from pdserve.gateway.disaggregated.prefill_placement import PrefillLedger, PrefillTicket, Where, place
from pdserve.gateway.disaggregated.prefix_affinity import PrefixAffinity
from pdserve.gateway.disaggregated.replica_clients import DecodeClient, PrefillClient, Timeouts
from pdserve.gateway.disaggregated.request import DisaggregatedRequest, Route
from pdserve.gateway.disaggregated.request_store import RequestStore
from pdserve.gateway.disaggregated.router import NoReplicaError, Router
from pdserve.gateway.front.frontend_types import GenerateInput, StreamChunk, UnavailableError
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.gateway.front.tokenization import PromptBuilder
from pdserve.protocol.errors import TransportUnavailableError
from pdserve.protocol.kv_blocks import num_blocks_for
from pdserve.protocol.transport_choice import choose_transport

logger = logging.getLogger(__name__)
DISPATCH_POLL_S = 0.05
"""How often the dispatcher looks again while requests wait and nothing woke it: the replicas'
load also changes under other gateways' requests."""
FULL_DECODE_HOLD_S = 1.0  # a decode replica that refused a reservation gets none for this long, or until a request ends


@dataclass(frozen=True, slots=True)
class DisaggregatedConfig:
    model_name: str
    forced_transport: int | None = None  # None: choose from the replicas' host and device
    timeouts: Timeouts = field(default_factory=Timeouts)
    migration_limit: int = 3  # times one request may move off replicas that went away
    internal_auth: InternalAuth = InternalAuth.open()  # what calls to the replicas present
    ttft_slo_s: float = 2.0  # the time-to-first-token target the line orders by
    line_order: str = "slo"  # gateway.disaggregated.prefill_line.ORDERS
    prefill_placement: str = "auto"  # gateway.disaggregated.prefill_placement.PLACEMENTS


@dataclass(frozen=True, slots=True)
class _Ask:
    """What the dispatcher needs to place one waiting attempt."""

    token_ids: list[int]
    excluded_replica_ids: set[str]
    cached: dict[str, dict[str, int]]  # kind -> {replica_id: prompt tokens it holds cached}


@dataclass(frozen=True, slots=True)
class _Placement:
    decode: ReplicaInfo
    prefill: ReplicaInfo | None  # None: the decode replica prefills
    transport: int
    ticket: PrefillTicket


class DisaggregatedFrontend:
    def __init__(self, config: DisaggregatedConfig, prompts: PromptBuilder, replicas: LiveReplicas,
                 store: RequestStore, metrics: GatewayMetrics, affinity: PrefixAffinity | None = None):
        self.config = config
        self.model_name = config.model_name
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self.max_model_len = prompts.max_model_len
        self.replicas = replicas
        self.store = store
        self.metrics = metrics
        self.router = Router()
        self.affinity = affinity or PrefixAffinity(None)  # None: load-only routing
        self.channels = ChannelPool(config.internal_auth)
        self.line = PrefillLine(config.line_order, config.ttft_slo_s)
        self.ledger = PrefillLedger()
        self._asks: dict[Waiter, _Ask] = {}
        self._wake = asyncio.Event()
        self._dispatcher: asyncio.Task | None = None
        self._full_decodes: dict[str, float] = {}  # replica id -> until when it gets no reservation
        self._decode_clients: dict[tuple[str, str], DecodeClient] = {}  # (replica id, endpoint): its session
        self._live: dict[str, DisaggregatedRequest] = {}
        self._has_replicas = False

    def health(self) -> bool:
        return self._has_replicas

    async def refresh_replicas(self) -> None:
        """Re-reads the registry: health, and the per-replica load gauges."""
        try:
            prefills, decodes = await self.replicas.list("prefill"), await self.replicas.list("decode")
        except Exception:
            self._has_replicas = False  # Redis unreachable: cannot route
            raise
        self._has_replicas = bool(prefills) and bool(decodes)
        self.metrics.on_replica_loads(prefills + decodes)

    async def abort(self, request_id: str) -> bool:
        request = self._live.get(request_id)
        if request is None:
            return False
        await request.abort()
        return True

    async def generate(self, request: GenerateInput) -> AsyncIterator[StreamChunk]:
        request_id, prompt_ids, params = await self.prompts.prepare(request, self._live)
        text = CompletionText(self.tokenizer, request_id, prompt_ids, params)
        driven = DisaggregatedRequest(request_id, prompt_ids, params, text, self.route, self.store, self.metrics,
                                      Migrations(self.config.migration_limit), request.owner)
        self._live[request_id] = driven
        try:
            async with contextlib.aclosing(driven.stream()) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self._live.pop(request_id, None)
            self._full_decodes.clear()  # its decode blocks are free again
            self._wake.set()

    async def keep_records_alive(self) -> None:
        """Renews the live TTL of the records of the requests this gateway drives, four times per
        TTL, until cancelled; a renewal that cannot reach Redis is logged and tried again."""
        while True:
            await asyncio.sleep(self.store.live_ttl_s / 4)
            try:
                await self.store.keep_alive(list(self._live))
            except StateStoreUnavailableError as exc:
                logger.warning("live request records not renewed: %s", exc)

    async def route(self, request_id: str, token_ids: list[int], excluded_replica_ids: set[str],
                    arrival_s: float) -> Route:
        """Waits in the line until the attempt is placed (none of `excluded_replica_ids`), and for
        a remote prefill reserves its decode blocks; a decode replica out of blocks sends it back
        to its place in the line."""
        deadline_s = time.monotonic() + self.config.timeouts.request_s
        while True:
            placement = await self._wait_turn(token_ids, excluded_replica_ids, arrival_s, deadline_s)
            decode = self._decode_client(placement.decode.replica_id, placement.decode.endpoint)
            if placement.prefill is None:
                return Route(decode, None, placement.transport, None, placement.ticket)
            try:
                target = await decode.reserve(request_id, token_ids, placement.transport)
            except BaseException as exc:
                placement.ticket.done(first_token=False)
                if not (isinstance(exc, BackendError) and exc.grpc_code is grpc.StatusCode.RESOURCE_EXHAUSTED):
                    raise
                self._full_decodes[decode.replica_id] = time.monotonic() + FULL_DECODE_HOLD_S
                continue
            prefill = PrefillClient(placement.prefill.replica_id, self.channels.get(placement.prefill.endpoint),
                                    self.config.timeouts)
            return Route(decode, prefill, placement.transport, target, placement.ticket)

    async def _wait_turn(self, token_ids: list[int], excluded_replica_ids: set[str], arrival_s: float,
                         deadline_s: float) -> _Placement:
        decodes, prefills = await self._live_replicas(excluded_replica_ids)
        ask = _Ask(token_ids, excluded_replica_ids, await self.affinity.cached_tokens(prefills + decodes, token_ids))
        waiter = self.line.join(len(token_ids), arrival_s)
        self._asks[waiter] = ask
        if self._dispatcher is None:
            self._dispatcher = asyncio.create_task(self._dispatch())
        self._wake.set()
        taken = False
        try:
            placement = await asyncio.wait_for(asyncio.shield(waiter.turn), deadline_s - time.monotonic())
            taken = True
            return placement
        except TimeoutError:
            raise BackendError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"no replica could take the prompt within {self.config.timeouts.request_s:g} s") from None
        finally:
            self.line.leave(waiter)
            self._asks.pop(waiter, None)
            turn = waiter.turn
            if not taken and turn.done() and not turn.cancelled() and turn.exception() is None:
                turn.result().ticket.done(first_token=False)  # placed, but its request went away meanwhile
            elif not turn.done():
                turn.cancel()

    async def _live_replicas(self, excluded_replica_ids: set[str]) -> tuple[list[ReplicaInfo], list[ReplicaInfo]]:
        decodes, prefills = await asyncio.gather(self.replicas.list("decode"), self.replicas.list("prefill"))
        return ([r for r in decodes if r.replica_id not in excluded_replica_ids],
                [r for r in prefills if r.replica_id not in excluded_replica_ids])

    async def _dispatch(self) -> None:
        """Hands out turns in the line's order while the replicas can take them (see `_place`)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), DISPATCH_POLL_S if len(self.line) else None)
            self._wake.clear()
            if not len(self.line):
                continue
            try:
                decodes, prefills = await self._live_replicas(set())
            except Exception as exc:  # Redis unreachable: the waiters wait, each up to its deadline
                logger.warning("dispatcher cannot list replicas: %s", exc)
                continue
            try:
                self._hand_out_turns(decodes, prefills)
            except Exception:
                logger.exception("dispatcher failed a round; it carries on")

    def _hand_out_turns(self, decodes: list[ReplicaInfo], prefills: list[ReplicaInfo]) -> None:
        now_s = time.monotonic()
        for waiter in self.line.ordered(now_s, self.ledger.s_per_token[Where.REMOTE]):
            ask = self._asks.get(waiter)
            if ask is None or waiter.turn.done():
                continue
            try:
                placement = self._place(ask, decodes, prefills, now_s)
            except (UnavailableError, BackendError) as exc:
                self.line.leave(waiter)
                waiter.turn.set_exception(exc)
                continue
            if placement is None:
                break
            self.line.leave(waiter)
            waiter.turn.set_result(placement)

    def _place(self, ask: _Ask, decodes: list[ReplicaInfo], prefills: list[ReplicaInfo],
               now_s: float) -> _Placement | None:
        """The replicas for `ask` now, counted against their load; None: it waits."""
        decodes = [r for r in decodes if r.replica_id not in ask.excluded_replica_ids]
        prefills = [r for r in prefills if r.replica_id not in ask.excluded_replica_ids]
        num_tokens = len(ask.token_ids)
        try:
            decode = self.router.pick_decode(decodes, num_tokens, ask.cached["decode"])
            prefill = self.router.pick_prefill(prefills, ask.cached["prefill"])
        except NoReplicaError as exc:
            raise UnavailableError(str(exc)) from exc
        if self._full_decodes.get(decode.replica_id, 0.0) > now_s or not _fits(decode, num_tokens):
            return None  # its blocks come back as requests end
        cached_decode = ask.cached["decode"].get(decode.replica_id, 0)
        cached_prefill = ask.cached["prefill"].get(prefill.replica_id, 0)
        where = place(self.config.prefill_placement, num_tokens, cached_decode,
                      self.ledger.backlog(Where.REMOTE, prefill.replica_id),
                      self.ledger.backlog(Where.LOCAL, decode.replica_id), self.ledger.s_per_token,
                      self.config.ttft_slo_s / 2)
        if where is None:
            return None
        self.router.note_dispatched(decode, num_tokens - cached_decode)
        self.metrics.on_prefill_placed(where.value)
        if where is Where.LOCAL:
            ticket = PrefillTicket(self.ledger, self.ledger.send(where, decode.replica_id, num_tokens - cached_decode),
                                   self._wake.set)
            return _Placement(decode, None, 0, ticket)
        try:
            transport = choose_transport(prefill.host_id, prefill.device, decode.host_id, decode.device,
                                         self.config.forced_transport)
        except TransportUnavailableError as exc:
            raise BackendError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
        self.router.note_dispatched(prefill, num_tokens - cached_prefill)
        ticket = PrefillTicket(self.ledger, self.ledger.send(where, prefill.replica_id, num_tokens - cached_prefill),
                               self._wake.set)
        return _Placement(decode, prefill, transport, ticket)

    def _decode_client(self, replica_id: str, endpoint: str) -> DecodeClient:
        key = replica_id, endpoint
        if key not in self._decode_clients:
            self._decode_clients[key] = DecodeClient(replica_id, self.channels.get(endpoint), self.config.timeouts)
        return self._decode_clients[key]

    async def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        for client in self._decode_clients.values():
            client.close()
        self._decode_clients.clear()
        await self.channels.close()


def _fits(decode: ReplicaInfo, num_tokens: int) -> bool:
    """Whether the decode replica's free blocks, as counted here, hold the prompt; raises when
    its whole pool never could."""
    if not decode.block_size:
        return True
    num_blocks = num_blocks_for(num_tokens, decode.block_size)
    if decode.total_blocks and num_blocks > decode.total_blocks:
        raise BackendError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"the prompt needs {num_blocks} KV blocks; decode replica {decode.replica_id} holds "
                           f"{decode.total_blocks} in all")
    return decode.free_blocks >= num_blocks
