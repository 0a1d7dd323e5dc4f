"""The `Frontend` contract over a disaggregated deployment: each request runs through a decode
and a prefill replica found in the registry.

`generate` tokenizes the request, fits its parameters and hands it to a `DisaggregatedRequest`
(gateway.disaggregated.request), which drives it through its states and calls `route` for each
attempt. `route` picks decode = most free KV blocks, prefill = fewest queued prompt tokens, each
counting the prompt's blocks it holds cached in its favour (gateway.disaggregated.router), and the KV
transport from both replicas' host and device unless the config forces one.

Invariants: a request is live here (found by `abort`, its Redis record's TTL renewed by
`keep_records_alive`) from the moment it is prepared until its stream closes, so the record of
a request no gateway drives any more expires. Between a pick and counting it against the
replica's load there is no await, so each pick sees every dispatch this gateway made before it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.redis_client import StateStoreUnavailableError
from pdserve.cluster.registry import LiveReplicas
from pdserve.gateway.disaggregated.backend_errors import BackendError
from pdserve.gateway.disaggregated.channels import ChannelPool
from pdserve.gateway.disaggregated.completion_text import CompletionText
from pdserve.gateway.disaggregated.migration import Migrations
from pdserve.gateway.disaggregated.prefix_affinity import PrefixAffinity
from pdserve.gateway.disaggregated.replica_clients import DecodeClient, PrefillClient, Timeouts
from pdserve.gateway.disaggregated.request import DisaggregatedRequest, Route
from pdserve.gateway.disaggregated.request_store import RequestStore
from pdserve.gateway.disaggregated.router import NoReplicaError, Router
from pdserve.gateway.front.frontend_types import GenerateInput, StreamChunk, UnavailableError
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.gateway.front.tokenization import PromptBuilder
from pdserve.protocol.errors import TransportUnavailableError
from pdserve.protocol.transport_choice import choose_transport

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DisaggregatedConfig:
    model_name: str
    forced_transport: int | None = None  # None: choose from the replicas' host and device
    timeouts: Timeouts = field(default_factory=Timeouts)
    migration_limit: int = 3  # times one request may move off replicas that went away
    internal_auth: InternalAuth = InternalAuth.open()  # what calls to the replicas present


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

    async def keep_records_alive(self) -> None:
        """Renews the live TTL of the records of the requests this gateway drives, four times per
        TTL, until cancelled; a renewal that cannot reach Redis is logged and tried again."""
        while True:
            await asyncio.sleep(self.store.live_ttl_s / 4)
            try:
                await self.store.keep_alive(list(self._live))
            except StateStoreUnavailableError as exc:
                logger.warning("live request records not renewed: %s", exc)

    async def route(self, token_ids: list[int], excluded_replica_ids: set[str]) -> Route:
        """Picks the replicas (none of `excluded_replica_ids`) and the transport for `token_ids`
        to prefill, and counts them against the replicas' load."""
        num_tokens = len(token_ids)
        decodes, prefills = await asyncio.gather(self.replicas.list("decode"), self.replicas.list("prefill"))
        decodes = [replica for replica in decodes if replica.replica_id not in excluded_replica_ids]
        prefills = [replica for replica in prefills if replica.replica_id not in excluded_replica_ids]
        cached = await self.affinity.cached_tokens(prefills + decodes, token_ids)
        # No await from here on: each pick sees every dispatch this gateway made before it.
        try:
            decode = self.router.pick_decode(decodes, num_tokens, cached["decode"])
            prefill = self.router.pick_prefill(prefills, cached["prefill"])
        except NoReplicaError as exc:
            raise UnavailableError(str(exc)) from exc
        try:
            transport = choose_transport(prefill.host_id, prefill.device, decode.host_id, decode.device,
                                         self.config.forced_transport)
        except TransportUnavailableError as exc:
            raise BackendError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
        self.router.note_dispatched(decode, num_tokens - cached["decode"].get(decode.replica_id, 0))
        self.router.note_dispatched(prefill, num_tokens - cached["prefill"].get(prefill.replica_id, 0))
        return Route(self._decode_client(decode.replica_id, decode.endpoint),
                     PrefillClient(prefill.replica_id, self.channels.get(prefill.endpoint), self.config.timeouts),
                     transport)

    def _decode_client(self, replica_id: str, endpoint: str) -> DecodeClient:
        key = replica_id, endpoint
        if key not in self._decode_clients:
            self._decode_clients[key] = DecodeClient(replica_id, self.channels.get(endpoint), self.config.timeouts)
        return self._decode_clients[key]

    async def close(self) -> None:
        for client in self._decode_clients.values():
            client.close()
        self._decode_clients.clear()
        await self.channels.close()
