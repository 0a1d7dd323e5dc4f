"""The `Frontend` contract over a disaggregated deployment: one request through a decode and a
prefill replica, found in the registry.

    1. tokenize, fit parameters, record QUEUED                              (DisaggregatedFrontend)
    2. route: decode = most free KV blocks, prefill = fewest queued prompt tokens, each counting
       the prompt's blocks it holds cached in its favour (gateway.router); pick transport
    3. Decode.Reserve → KVTarget (blocks reserved on D)                      state PREFILLING
    4. Prefill.Run(prompt, KVTarget): first token streams back at once      state TRANSFERRING
       and P pushes the KV into D's blocks; the call ends when D has it
    5. generate(first token) on D's session: the rest, one message per step  state DECODING
    6. detokenize incrementally here, check stop strings, stream chunks     state FINISHED
Steps 2-6 are `DisaggregatedRequest`, which reads as that order; the replica clients own the
wire. When a replica goes away under the request (gateway.migration), steps 2-5 run again on the
replicas left, with prompt + the tokens streamed so far: prefill computes their KV and samples
the next token, decode carries on after it, and the client's stream goes on as if nothing
happened. Each such attempt has its own request id on the replicas, so nothing left of an
earlier one can touch it. Prefill (first token) and decode (the rest) say when a token ends the request, so step 5
is skipped when the first token already did. Whatever way a request ends early (client gone,
Abort, a stop string, a failure), the reservation and any running work are aborted on both
replicas, so every KV block comes back.

Every request recorded in Redis reaches a terminal record: however it stops (a client that
leaves can cancel the task driving it more than once), its end (replica aborts, the terminal
state) runs to completion under `run_to_end`, bounded by END_DEADLINE_S. A state write that
cannot reach Redis while the request streams is logged in one line and the stream goes on; the
record then ends with its last write, or expires with its live TTL, which this gateway renews
(`keep_records_alive`) only while it drives the request.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.redis_client import StateStoreUnavailableError
from pdserve.cluster.registry import LiveReplicas
from pdserve.engine.admission import draw_seed
from pdserve.engine.errors import IllegalTransitionError, PdserveError
from pdserve.engine.sampling_params import SamplingParams
from pdserve.gateway.backend_errors import BackendError
from pdserve.gateway.channels import ChannelPool
from pdserve.gateway.completion_text import CompletionText, SampledToken
from pdserve.gateway.frontend_types import GenerateInput, StreamChunk, UnavailableError
from pdserve.gateway.metrics import GatewayMetrics, RequestTimeline
from pdserve.gateway.migration import Migrations
from pdserve.gateway.prefix_affinity import PrefixAffinity
from pdserve.gateway.replica_clients import DecodeClient, PrefillClient, Timeouts
from pdserve.gateway.request_state import RequestState
from pdserve.gateway.request_store import RequestNotFoundError, RequestStore
from pdserve.gateway.router import NoReplicaError, Router
from pdserve.gateway.run_to_end import run_to_end
from pdserve.gateway.tokenization import PromptBuilder
from pdserve.kvtransfer.choice import choose_transport, transport_name
from pdserve.kvtransfer.errors import TransportUnavailableError

logger = logging.getLogger(__name__)

END_DEADLINE_S = 30.0
"""Longest a request's end may take: its replica aborts (each bounded by Timeouts.rpc_s) and its
terminal record."""


class AbortedError(PdserveError):
    """The request was aborted through the API while the gateway drove it."""


@dataclass(frozen=True, slots=True)
class DisaggregatedConfig:
    model_name: str
    forced_transport: int | None = None  # None: choose from the replicas' host and device
    timeouts: Timeouts = field(default_factory=Timeouts)
    migration_limit: int = 3  # times one request may move off replicas that went away
    internal_auth: InternalAuth = InternalAuth.open()  # what calls to the replicas present


@dataclass(frozen=True, slots=True)
class Route:
    decode: DecodeClient
    prefill: PrefillClient
    transport: int  # common_pb2.Transport


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


class DisaggregatedRequest:
    """One request while the gateway drives it: the order of its states, and its abort flag."""

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, text: CompletionText,
                 route: Callable[[list[int], set[str]], Awaitable[Route]], store: RequestStore, metrics: GatewayMetrics,
                 migrations: Migrations, owner: str = ""):
        self.request_id = request_id
        self.owner = owner  # the caller's fingerprint (gateway.api_keys), kept in its record
        self.prompt_ids = prompt_ids
        self.params = params
        self.seed = draw_seed(params.seed)
        self.text = text
        self.aborted = False
        self._find_route = route
        self._route: Route | None = None
        self._replica_request_id = request_id  # the request's id on its current replicas
        self._migrations = migrations
        self._store = store
        self._metrics = metrics
        self._recorded = False  # its record was created; only then is it counted and ended in Redis
        self._record_behind = False  # a write of its record was missed while it streamed
        self._ended = False
        self._started_s = self._last_token_s = time.monotonic()
        self._last_itl_s = 0.0
        self._timeline = RequestTimeline(arrival_s=self._started_s)

    async def abort(self) -> None:
        """Aborts the request on its replicas; the stream then ends with an "abort" chunk."""
        self.aborted = True
        await self._abort_on_replicas()

    async def stream(self) -> AsyncIterator[StreamChunk]:
        """The request's chunks, and its end recorded however it comes."""
        try:
            # A cancel while the record is written lets the write finish, so the end below sees it.
            await run_to_end(self._create_record(), END_DEADLINE_S, f"the record of request {self.request_id}")
            async with contextlib.aclosing(self._run()) as chunks:
                async for chunk in chunks:
                    yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            await self._end(RequestState.ABORTED, "abort", "client went away")
            raise
        except Exception as exc:
            if not self.aborted:
                await self._end(RequestState.FAILED, "error", str(exc) or repr(exc))
                raise
            await self._end(RequestState.ABORTED, "abort", "aborted")
            yield self._abort_chunk()

    async def _create_record(self) -> None:
        await self._store.create(self.request_id, len(self.prompt_ids), owner=self.owner)
        self._recorded = True
        self._metrics.on_request_start()

    async def _run(self) -> AsyncIterator[StreamChunk]:
        """Attempts until one finishes the request; a replica going away under it starts another."""
        while True:
            try:
                async with contextlib.aclosing(self._attempt()) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            except BackendError as exc:
                failed_replica_id = self._migrations.failed_replica(exc)
                if failed_replica_id is None or self.aborted:
                    raise
                await self._migrate(exc, failed_replica_id)

    async def _attempt(self) -> AsyncIterator[StreamChunk]:
        """Steps 2-5 from the tokens streamed so far (none on the first attempt) to the end."""
        request_id, prompt_ids, output_ids = self._replica_request_id, self.prompt_ids, list(self.text.token_ids)
        token_ids = prompt_ids + output_ids
        route = self._route = await self._find_route(token_ids, self._migrations.excluded_replica_ids)
        target = await route.decode.reserve(request_id, token_ids, route.transport)
        await self._enter(RequestState.PREFILLING, prefill_replica=route.prefill.replica_id,
                          decode_replica=route.decode.replica_id, transport=transport_name(route.transport))
        if self._timeline.scheduled_s is None:
            self._timeline.scheduled_s = time.monotonic()
        prefill = route.prefill.run(request_id, prompt_ids, output_ids, self.params, self.seed, target)
        try:
            first = await prefill.first_token()
            chunk = self._accept(first)
            if output_ids:
                self._metrics.on_token(self._last_itl_s)
            else:
                self._metrics.on_first_token(self._last_token_s - self._started_s)
            yield chunk
            await self._enter(RequestState.TRANSFERRING)
            done = await prefill.transfer_done()
        except BaseException:
            prefill.cancel()
            raise
        self._metrics.on_kv_transfer(done.transport, done.num_bytes, done.seconds)
        await self._record_in_flight(self._store.update(self.request_id, kv_bytes=done.num_bytes,
                                                        kv_transfer_s=done.seconds), "its KV transfer")
        if self.text.finished:
            await self._abort_on_replicas()  # releases the reservation no token will use
            await self._end(RequestState.FINISHED, self.text.finish_reason, "")
            return

        await self._enter(RequestState.DECODING)
        steps = route.decode.generate(request_id, prompt_ids, output_ids, self.params, self.seed, first.token_id)
        async with contextlib.aclosing(steps):  # after a stop string, closing aborts on decode
            async for step in steps:
                for token in step.tokens:
                    chunk = self._accept(token)
                    self._metrics.on_token(self._last_itl_s)
                    yield chunk
                    if self.text.finished:
                        break
                if self.text.finished:
                    break
        if not self.text.finished:
            raise BackendError(grpc.StatusCode.INTERNAL,
                               f"decode replica {route.decode.replica_id} ended the stream before the request finished")
        self._metrics.on_preemptions(step.num_preemptions)
        await self._end(RequestState.FINISHED, self.text.finish_reason, "")

    async def _migrate(self, error: BackendError, failed_replica_id: str) -> None:
        """Gives back what the failed attempt holds and readies the next, or raises past the limit."""
        route = self._route
        kind = "decode" if route is not None and failed_replica_id == route.decode.replica_id else "prefill"
        await self._abort_on_replicas(gone_replica_id=failed_replica_id)
        self._migrations.start(self.request_id, error, failed_replica_id)
        self._metrics.on_migration(f"{kind}_unavailable")
        self._replica_request_id = f"{self.request_id}#{self._migrations.num_done}"
        logger.warning("request %s: %s replica %s went away (%s); migrating with %d tokens streamed (%d of %d)",
                       self.request_id, kind, failed_replica_id, error, self.text.num_output_tokens,
                       self._migrations.num_done, self._migrations.limit)

    def _accept(self, token: SampledToken) -> StreamChunk:
        now_s = time.monotonic()
        self._last_itl_s, self._last_token_s = now_s - self._last_token_s, now_s
        self._timeline.on_token(now_s)
        return self.text.push(token)

    async def _enter(self, state: RequestState, **fields) -> None:
        if self.aborted:
            raise AbortedError(f"request {self.request_id} was aborted")
        await self._record_in_flight(self._store.transition(self.request_id, state, **fields), state.name)

    async def _record_in_flight(self, write: Awaitable[None], what: str) -> None:
        """A record write of a streaming request. One that cannot reach Redis, or finds the record
        gone (a Redis restarted empty), does not stop the stream; after such a miss the record is
        behind, so a move it cannot make from there does not stop it either."""
        try:
            await write
        except (StateStoreUnavailableError, RequestNotFoundError) as exc:
            self._record_behind = True
            logger.warning("request %s: %s not recorded: %s", self.request_id, what, exc)
        except IllegalTransitionError as exc:
            if not self._record_behind:
                raise
            logger.warning("request %s: %s not recorded: %s", self.request_id, what, exc)

    async def _end(self, state: RequestState, reason: str, error: str) -> None:
        """Ends the request once, whoever cancels the caller meanwhile (see `run_to_end`)."""
        if self._ended:
            return
        self._ended = True
        if self._recorded:
            self._metrics.on_finish(reason, len(self.prompt_ids), self.text.num_output_tokens,
                                    time.monotonic() - self._started_s, self._timeline)
        await run_to_end(self._finish(state, error), END_DEADLINE_S, f"the end of request {self.request_id}")

    async def _finish(self, state: RequestState, error: str) -> None:
        """Aborts leftovers on the replicas unless finished, and records how the request ended."""
        if state is not RequestState.FINISHED:
            await self._abort_on_replicas()
        if not self._recorded:
            return
        try:
            await self._store.transition(self.request_id, state, completion_tokens=self.text.num_output_tokens,
                                         error=error)
        except Exception as exc:
            logger.warning("request %s: could not record %s: %s", self.request_id, state.name, exc)

    async def _abort_on_replicas(self, gone_replica_id: str | None = None) -> None:
        """Aborts the current attempt on its replicas, except on one known to be gone (an abort
        sent there could only wait for its timeout)."""
        if self._route is None:
            return
        request_id = self._replica_request_id
        replicas = [r for r in (self._route.decode, self._route.prefill) if r.replica_id != gone_replica_id]
        results = await asyncio.gather(*(r.abort(request_id) for r in replicas), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                logger.warning("abort of %s on a replica failed: %s", request_id, result)

    def _abort_chunk(self) -> StreamChunk:
        return StreamChunk(
            request_id=self.request_id, token_ids=[], text="", logprobs=[], finish_reason="abort",
            stop_reason=None, prompt_tokens=len(self.prompt_ids), completion_tokens=self.text.num_output_tokens)
