"""The gateway's dispatcher: hands each waiting attempt its replicas, in the line's order, when
they can take it.

    turn(prompt) ──▶ waits in the line (gateway.disaggregated.prefill_line) ──▶ `Placement`
                     a decode replica, and a prefill replica or None (the decode replica
                     prefills), with the transport between them and a `PrefillTicket`

One task walks the line whenever something may have changed (an attempt joined, a first token
came back, a request ended, a decode replica refused a reservation) and every DISPATCH_POLL_S
while attempts wait (other gateways change the replicas' load too). For the waiter at the head
it picks, among the replicas not ejected (gateway.disaggregated.outliers), decode = most free
KV blocks and prefill = fewest queued prompt tokens, each counting the prompt's blocks it holds
cached in its favour (gateway.disaggregated.router), among the pairs whose KV layouts match
(gateway.disaggregated.pairing), and the side to prefill on
(gateway.disaggregated.prefill_placement); a head it cannot place yet (its decode replica's free
blocks, as counted here, cannot hold the prompt, or neither side can take it) ends the walk, so
no waiter overtakes one ahead of it in the order.

Invariants: between a pick and counting it against the replicas' load (the router's pending
dispatches, the ledger's backlog) there is no await, so each pick sees every dispatch this gateway
made before it; every placement's ticket is done exactly once, by its attempt or, when the
attempt went away before taking it, here.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import grpc

from pdserve.cluster.registry import LiveReplicas, ReplicaInfo
from pdserve.gateway.disaggregated.backend_errors import BackendError
from pdserve.gateway.disaggregated.outliers import Outliers
from pdserve.gateway.disaggregated.pairing import pairable_decodes, partners
from pdserve.gateway.disaggregated.prefill_line import PrefillLine, Waiter
from pdserve.gateway.disaggregated.prefill_placement import PrefillLedger, PrefillTicket, Where, place
from pdserve.gateway.disaggregated.prefix_affinity import PrefixAffinity
from pdserve.gateway.disaggregated.router import NoReplicaError, Router
from pdserve.gateway.front.frontend_types import UnavailableError
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.protocol.errors import TransportUnavailableError
from pdserve.protocol.kv_blocks import num_blocks_for
from pdserve.protocol.transport_choice import choose_transport

logger = logging.getLogger(__name__)
DISPATCH_POLL_S = 0.05
FULL_DECODE_HOLD_S = 1.0  # a decode replica that refused a reservation gets none for this long, or until a request ends


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    ttft_slo_s: float = 2.0  # the time-to-first-token target: the line's order, half of it a side's queue
    line_order: str = "slo"  # gateway.disaggregated.prefill_line.ORDERS
    prefill_placement: str = "auto"  # gateway.disaggregated.prefill_placement.PLACEMENTS
    forced_transport: int | None = None  # None: choose from the replicas' host and device


@dataclass(frozen=True, slots=True)
class Placement:
    decode: ReplicaInfo
    prefill: ReplicaInfo | None  # None: the decode replica prefills
    transport: int  # common_pb2.Transport; unset for a local prefill
    ticket: PrefillTicket


@dataclass(frozen=True, slots=True)
class _Ask:
    """What the dispatcher needs to place one waiting attempt."""

    token_ids: list[int]
    excluded_replica_ids: set[str]
    cached: dict[str, dict[str, int]]  # kind -> {replica_id: prompt tokens it holds cached}


class Dispatcher:
    def __init__(self, config: DispatchConfig, replicas: LiveReplicas, affinity: PrefixAffinity, router: Router,
                 metrics: GatewayMetrics, outliers: Outliers | None = None):
        self.config = config
        self.replicas = replicas
        self.affinity = affinity
        self.router = router
        self.metrics = metrics
        self.outliers = outliers or Outliers()
        self.line = PrefillLine(config.line_order, config.ttft_slo_s)
        self.ledger = PrefillLedger()
        self._asks: dict[Waiter, _Ask] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._full_decodes: dict[str, float] = {}  # replica id -> until when it gets no reservation

    async def turn(self, token_ids: list[int], excluded_replica_ids: set[str], arrival_s: float,
                   timeout_s: float) -> Placement:
        """The attempt's placement, once its turn comes (none of `excluded_replica_ids`). Raises
        UnavailableError with no replica of a kind (naming the excluded ones, when they were all
        there was) or no pair of matching KV layouts, BackendError for a prompt no decode replica
        could ever hold, DEADLINE_EXCEEDED after `timeout_s`."""
        eligible: list[ReplicaInfo] = []
        for kind, replicas in zip(("decode", "prefill"), await self._live_replicas()):
            left = [r for r in replicas if r.replica_id not in excluded_replica_ids]
            if replicas and not left:
                raise UnavailableError(f"no {kind} replica left for this request: it failed on "
                                       f"{', '.join(sorted(r.replica_id for r in replicas))}")
            eligible += left
        ask = _Ask(token_ids, excluded_replica_ids, await self.affinity.cached_tokens(eligible, token_ids))
        waiter = self.line.join(len(token_ids), arrival_s)
        self._asks[waiter] = ask
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        self._wake.set()
        taken = False
        try:
            placement = await asyncio.wait_for(asyncio.shield(waiter.turn), timeout_s)
            taken = True
            return placement
        except TimeoutError:
            raise BackendError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"no replica could take the prompt within {timeout_s:g} s") from None
        finally:
            self.line.leave(waiter)
            self._asks.pop(waiter, None)
            if not taken and waiter.turn.done() and not waiter.turn.cancelled() and waiter.turn.exception() is None:
                waiter.turn.result().ticket.done(first_token=False)  # placed, but its attempt went away meanwhile
            elif not waiter.turn.done():
                waiter.turn.cancel()

    def decode_full(self, replica_id: str) -> None:
        """The replica refused a reservation: it gets none until a request ends, or for FULL_DECODE_HOLD_S."""
        self._full_decodes[replica_id] = time.monotonic() + FULL_DECODE_HOLD_S
        self._wake.set()

    def request_ended(self) -> None:
        """Its blocks are free again."""
        self._full_decodes.clear()
        self._wake.set()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _live_replicas(self) -> tuple[list[ReplicaInfo], list[ReplicaInfo]]:
        """(decodes, prefills)"""
        decodes, prefills = await asyncio.gather(self.replicas.list("decode"), self.replicas.list("prefill"))
        return decodes, prefills

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), DISPATCH_POLL_S if len(self.line) else None)
            self._wake.clear()
            if not len(self.line):
                continue
            try:
                decodes, prefills = await self._live_replicas()
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
               now_s: float) -> Placement | None:
        """The replicas for `ask` now, counted against their load; None: it waits."""
        decodes = self.outliers.usable([r for r in decodes if r.replica_id not in ask.excluded_replica_ids])
        prefills = self.outliers.usable([r for r in prefills if r.replica_id not in ask.excluded_replica_ids])
        num_tokens = len(ask.token_ids)
        try:
            decode = self.router.pick_decode(pairable_decodes(decodes, prefills), num_tokens, ask.cached["decode"])
            prefill = self.router.pick_prefill(partners(decode, prefills), ask.cached["prefill"])
        except NoReplicaError as exc:
            raise UnavailableError(str(exc)) from exc
        if self._full_decodes.get(decode.replica_id, 0.0) > now_s or not _fits(decode, num_tokens):
            return None  # its blocks come back as requests end
        num_local = num_tokens - ask.cached["decode"].get(decode.replica_id, 0)
        num_remote = num_tokens - ask.cached["prefill"].get(prefill.replica_id, 0)
        where = place(self.config.prefill_placement, num_tokens, num_tokens - num_local,
                      self.ledger.backlog(Where.REMOTE, prefill.replica_id),
                      self.ledger.backlog(Where.LOCAL, decode.replica_id), self.ledger.s_per_token,
                      self.config.ttft_slo_s / 2)
        if where is None:
            return None
        transport = 0
        if where is Where.REMOTE:
            try:
                transport = choose_transport(prefill.host_id, prefill.device, decode.host_id, decode.device,
                                             self.config.forced_transport)
            except TransportUnavailableError as exc:
                raise BackendError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
            self.router.note_dispatched(prefill, num_remote)
        self.router.note_dispatched(decode, num_local)
        self.metrics.on_prefill_placed(where.value)
        if where is Where.REMOTE:
            dispatch = self.ledger.send(where, prefill.replica_id, num_remote)
        else:
            dispatch, prefill = self.ledger.send(where, decode.replica_id, num_local), None
        return Placement(decode, prefill, transport, PrefillTicket(self.ledger, dispatch, self._wake.set))


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
