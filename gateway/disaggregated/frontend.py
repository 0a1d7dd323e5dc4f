"""The `Frontend` contract over a disaggregated deployment: each request runs through a decode
replica, and through a prefill replica unless its decode replica prefills it itself.

`generate` tokenizes the request, fits its parameters and hands it to a `DisaggregatedRequest`
(gateway.disaggregated.request), which drives it through its states and calls `route` for each
attempt. `route` waits for the attempt's turn (gateway.disaggregated.dispatcher: the line in SLO
order, the replicas, remote or local prefill) and, for a remote prefill, reserves the decode
blocks right before the prompt goes to prefill; a decode replica out of blocks (or past this
gateway's cap) sends the attempt back to its place in the line until a request ends. So a burst
queues in the gateway and is never refused for want of blocks: only admission's bound refuses (429),
and a replica whose waiting queue is at its bound (cluster.waiting_bound), which other gateways
can fill.

Invariant: a request is live here (found by `abort`, its Redis record's TTL renewed by
`keep_records_alive`, its replicas kept open by `refresh_replicas`) from the moment it is
prepared until its stream closes, so the record of a request no gateway drives any more
expires, and what the gateway holds for a replica that left the registry
(gateway.disaggregated.replica_links) is closed once no live request uses it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.redis_client import StateStoreUnavailableError
from pdserve.cluster.registry import LiveReplicas
from pdserve.gateway.disaggregated.backend_errors import ReplicaBusyError
from pdserve.gateway.disaggregated.completion_text import CompletionText
from pdserve.gateway.disaggregated.dispatcher import DispatchConfig, Dispatcher
from pdserve.gateway.disaggregated.migration import Migrations
from pdserve.gateway.disaggregated.outliers import Outliers
from pdserve.gateway.disaggregated.prefix_affinity import PrefixAffinity
from pdserve.gateway.disaggregated.replica_clients import Timeouts
from pdserve.gateway.disaggregated.replica_links import ReplicaLinks
from pdserve.gateway.disaggregated.request import DisaggregatedRequest, Route
from pdserve.gateway.disaggregated.request_store import RequestStore
from pdserve.gateway.disaggregated.router import Router
from pdserve.gateway.front.frontend_types import GenerateInput, StreamChunk
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.gateway.front.tokenization import PromptBuilder

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DisaggregatedConfig:
    model_name: str
    timeouts: Timeouts = field(default_factory=Timeouts)
    migration_limit: int = 3  # times one request may move off replicas that went away
    internal_auth: InternalAuth = InternalAuth.open()  # what calls to the replicas present
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)


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
        self.outliers = Outliers()
        self.links = ReplicaLinks(config.internal_auth, config.timeouts)
        self.dispatcher = Dispatcher(config.dispatch, replicas, affinity or PrefixAffinity(None), self.router,
                                     metrics, self.outliers)  # PrefixAffinity(None): load-only routing
        self._live: dict[str, DisaggregatedRequest] = {}
        self._has_replicas = False

    def health(self) -> bool:
        return self._has_replicas

    async def refresh_replicas(self) -> None:
        """Re-reads the registry: health, the per-replica load gauges, and the channels and
        sessions of replicas that left it, closed once no request uses them."""
        try:
            prefills, decodes = await self.replicas.list("prefill"), await self.replicas.list("decode")
        except Exception:
            self._has_replicas = False  # Redis unreachable: cannot route
            raise
        self._has_replicas = bool(prefills) and bool(decodes)
        self.metrics.on_replica_loads(prefills + decodes)
        in_use = {key for request in self._live.values() for key in request.replicas_in_use}
        await self.links.forget_gone({(r.replica_id, r.endpoint) for r in prefills + decodes}, in_use)

    async def abort(self, request_id: str, owner: str) -> bool:
        request = self._live.get(request_id)
        if request is None or request.owner != owner:
            return False
        await request.abort()
        return True

    async def generate(self, request: GenerateInput) -> AsyncIterator[StreamChunk]:
        request_id, prompt_ids, params = await self.prompts.prepare(request, self._live)
        text = CompletionText(self.tokenizer, request_id, prompt_ids, params)
        driven = DisaggregatedRequest(request_id, prompt_ids, params, text, self.route, self.store, self.metrics,
                                      Migrations(self.config.migration_limit, self.outliers), request.owner)
        self._live[request_id] = driven
        try:
            async with contextlib.aclosing(driven.stream()) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self._live.pop(request_id, None)
            self.dispatcher.request_ended()

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
        """The attempt's replicas once its turn comes (none of `excluded_replica_ids`), its decode
        blocks reserved for a remote prefill; a decode replica out of blocks sends it back to its
        place in the line."""
        deadline_s = time.monotonic() + self.config.timeouts.request_s
        while True:
            placement = await self.dispatcher.turn(token_ids, excluded_replica_ids, arrival_s,
                                                   deadline_s - time.monotonic())
            decode = self.links.decode(placement.decode.replica_id, placement.decode.endpoint)
            if placement.prefill is None:
                return Route(decode, None, placement.transport, None, placement.ticket)
            try:
                with self.links.held(decode.replica_id, decode.endpoint):
                    target = await decode.reserve(request_id, token_ids, placement.transport)
            except BaseException as exc:
                placement.ticket.done(first_token=False)
                if not isinstance(exc, ReplicaBusyError):
                    raise
                self.dispatcher.decode_full(decode.replica_id)
                continue
            prefill = self.links.prefill(placement.prefill.replica_id, placement.prefill.endpoint)
            return Route(decode, prefill, placement.transport, target, placement.ticket)

    async def close(self) -> None:
        self.dispatcher.close()
        await self.links.close()

