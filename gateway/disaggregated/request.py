"""One disaggregated request while the gateway drives it, in the order of its states
(gateway.front.request_state):

    1. record the request in Redis                                          state QUEUED
    2. route: waits in the gateway's line until the frontend places it: a decode replica, a
       prefill replica and a transport, and the blocks reserved on D (Decode.Reserve → KVTarget)
       right before the prompt goes to prefill (`Route`)                    state PREFILLING
    3. Prefill.Run(prompt, KVTarget): first token streams back at once      state TRANSFERRING
       and P pushes the KV into D's blocks; the call ends when D has it
    4. generate(first token) on D's session: the rest, one message per step  state DECODING
    5. detokenize incrementally, check stop strings, stream chunks          state FINISHED

Prefill (first token) and decode (the rest) say when a token ends the request, so step 4 is
skipped when the first token already did. When the frontend places the prefill on the decode
replica itself (`Route.prefill` is None), step 3 is skipped: step 4 sends the prompt, and the
first token comes in D's outputs like the rest. Either way the route's `ticket` is done at the
first token (or at the attempt's end), which tells the frontend what the prefill cost. The
replica clients own the wire.

When a replica fails the request (it went away, or as decode it failed the KV transfer:
gateway.disaggregated.migration), steps 2-4 run again on the replicas left, with prompt + the
tokens streamed so far: prefill computes their KV and samples the next token, decode carries on
after it, and the client's stream goes on as if nothing happened. Each such attempt has its own
request id on the replicas (gateway.front.request_ids), so nothing left of an earlier one can
touch it, and no client's request id can be one.

Whatever way a request ends early (client gone, Abort, a stop string, a failure), the
reservation and any running work are aborted on both replicas, so every KV block comes back.
Every request recorded in Redis reaches a terminal record: however it stops (a client that
leaves can cancel the task driving it more than once), its end (replica aborts, the terminal
state) runs to completion under `run_to_end`, bounded by END_DEADLINE_S. A state write that
cannot reach Redis while the request streams is logged in one line and the stream goes on; the
record then ends with its last write, or expires with its live TTL once no gateway renews it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from pdserve.cluster.redis_client import StateStoreUnavailableError
from pdserve.gateway.disaggregated.backend_errors import BackendError
from pdserve.gateway.disaggregated.completion_text import CompletionText, SampledToken
from pdserve.gateway.disaggregated.migration import Blame, Migrations, blame
from pdserve.gateway.disaggregated.prefill_placement import PrefillTicket
from pdserve.gateway.disaggregated.replica_clients import DecodeClient, PrefillClient
from pdserve.gateway.disaggregated.request_store import RequestNotFoundError, RequestStore
from pdserve.gateway.front.frontend_types import StreamChunk
from pdserve.gateway.front.metrics import GatewayMetrics, RequestTimeline
from pdserve.gateway.front.request_ids import attempt_request_id
from pdserve.gateway.front.request_state import LOCAL_PREFILL, RequestState
from pdserve.gateway.front.run_to_end import run_to_end
from pdserve.protocol.errors import AbortedError, IllegalTransitionError
from pdserve.protocol.request_checks import draw_seed
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.transport_choice import transport_name
from pdserve.v1 import kv_transfer_pb2

logger = logging.getLogger(__name__)

END_DEADLINE_S = 30.0
"""Longest a request's end may take: its replica aborts (each bounded by Timeouts.rpc_s) and its
terminal record."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where one attempt at a request runs."""

    decode: DecodeClient
    prefill: PrefillClient | None  # None: the decode replica prefills the prompt itself
    transport: int  # common_pb2.Transport; unset for a local prefill
    target: kv_transfer_pb2.KVTarget | None  # the blocks reserved on decode, for a remote prefill
    ticket: PrefillTicket

    @property
    def prefill_replica_id(self) -> str:
        return self.decode.replica_id if self.prefill is None else self.prefill.replica_id

    @property
    def transport_text(self) -> str:
        return LOCAL_PREFILL if self.prefill is None else transport_name(self.transport)


class DisaggregatedRequest:
    """One request while the gateway drives it: the order of its states, and its abort flag."""

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, text: CompletionText,
                 route: Callable[[str, list[int], set[str], float], Awaitable[Route]], store: RequestStore, metrics: GatewayMetrics,
                 migrations: Migrations, owner: str = ""):
        self.request_id = request_id
        self.owner = owner  # the caller's fingerprint (gateway.front.api_keys), kept in its record
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

    @property
    def replicas_in_use(self) -> set[tuple[str, str]]:
        """(replica id, endpoint) of each replica its current attempt uses; none while it waits
        for its route."""
        if self._route is None:
            return set()
        return {(client.replica_id, client.endpoint) for client in (self._route.decode, self._route.prefill)
                if client is not None}

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
                route = self._route
                decode_replica_id = route.decode.replica_id if route else None
                prefill_replica_id = route.prefill.replica_id if route and route.prefill else None
                blamed = blame(exc, decode_replica_id, prefill_replica_id)
                if blamed is None or self.aborted:
                    raise
                await self._migrate(exc, blamed, self._endpoint_of(blamed.replica_id, exc))

    async def _attempt(self) -> AsyncIterator[StreamChunk]:
        """Steps 2-4 from the tokens streamed so far (none on the first attempt) to the end."""
        request_id, prompt_ids, output_ids = self._replica_request_id, self.prompt_ids, list(self.text.token_ids)
        self._route = None  # until this attempt's replicas are known
        route = self._route = await self._find_route(request_id, prompt_ids + output_ids,
                                                     self._migrations.excluded_replica_ids, self._started_s)
        try:
            await self._enter(RequestState.PREFILLING, prefill_replica=route.prefill_replica_id,
                              decode_replica=route.decode.replica_id, transport=route.transport_text)
            if self._timeline.scheduled_s is None:
                self._timeline.scheduled_s = time.monotonic()
            first_token_id = None
            if route.prefill is not None:
                async with contextlib.aclosing(self._prefill_remotely(route)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                if self.text.finished:
                    await self._abort_on_replicas()  # releases the reservation no token will use
                    await self._end(RequestState.FINISHED, self.text.finish_reason, "")
                    return
                first_token_id = self.text.token_ids[-1]
                await self._enter(RequestState.DECODING)

            steps = route.decode.generate(request_id, prompt_ids, output_ids, self.params, self.seed, first_token_id)
            async with contextlib.aclosing(steps):  # after a stop string, closing aborts on decode
                async for step in steps:
                    for token in step.tokens:
                        if first_token_id is None:  # prefilled here: this is the first token
                            first_token_id = token.token_id
                            route.ticket.done(first_token=True)
                            yield self._accept_first(token, resumed=bool(output_ids))
                            await self._enter(RequestState.DECODING)
                        else:
                            chunk = self._accept(token)
                            self._metrics.on_token(self._last_itl_s)
                            yield chunk
                        if self.text.finished:
                            break
                    if self.text.finished:
                        break
        finally:
            route.ticket.done(first_token=False)
        if not self.text.finished:
            raise BackendError(grpc.StatusCode.INTERNAL,
                               f"decode replica {route.decode.replica_id} ended the stream before the request finished")
        self._metrics.on_preemptions(step.num_preemptions)
        await self._end(RequestState.FINISHED, self.text.finish_reason, "")

    async def _prefill_remotely(self, route: Route) -> AsyncIterator[StreamChunk]:
        """Step 3: the first token from the prefill replica, then its KV pushed to decode."""
        output_ids = list(self.text.token_ids)
        prefill = route.prefill.run(self._replica_request_id, self.prompt_ids, output_ids, self.params, self.seed,
                                    route.target)
        try:
            first = await prefill.first_token()
            route.ticket.done(first_token=True)
            yield self._accept_first(first, resumed=bool(output_ids))
            await self._enter(RequestState.TRANSFERRING)
            done = await prefill.transfer_done()
        except BaseException:
            prefill.cancel()
            raise
        self._metrics.on_kv_transfer(done.transport, done.num_bytes, done.seconds)
        await self._record_in_flight(self._store.update(self.request_id, kv_bytes=done.num_bytes,
                                                        kv_transfer_s=done.seconds), "its KV transfer")

    def _accept_first(self, token: SampledToken, resumed: bool) -> StreamChunk:
        """The first token of an attempt: the request's first, or the next one of a resumed request."""
        chunk = self._accept(token)
        if resumed:
            self._metrics.on_token(self._last_itl_s)
        else:
            self._metrics.on_first_token(self._last_token_s - self._started_s)
        return chunk

    async def _migrate(self, error: BackendError, blamed: Blame, endpoint: str) -> None:
        """Gives back what the failed attempt holds and readies the next, or raises past the limit."""
        await self._abort_on_replicas(gone_replica_id=blamed.replica_id if blamed.gone else None)
        self._migrations.start(self.request_id, error, blamed, endpoint)
        self._metrics.on_migration(blamed.reason)
        self._replica_request_id = attempt_request_id(self.request_id, self._migrations.num_done)
        logger.warning("request %s: %s on replica %s (%s); migrating with %d tokens streamed (%d of %d)",
                       self.request_id, blamed.reason, blamed.replica_id, error, self.text.num_output_tokens,
                       self._migrations.num_done, self._migrations.limit)

    def _endpoint_of(self, replica_id: str, error: BackendError) -> str:
        """Where the blamed replica runs: its client's endpoint in the attempt's route, else the
        one its error names (a reservation that failed before the route was made)."""
        route = self._route
        clients = (route.decode, route.prefill) if route is not None else ()
        return next((c.endpoint for c in clients if c is not None and c.replica_id == replica_id), error.endpoint)

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
        replicas = [r for r in (self._route.decode, self._route.prefill)
                    if r is not None and r.replica_id != gone_replica_id]
        results = await asyncio.gather(*(r.abort(request_id) for r in replicas), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                logger.warning("abort of %s on a replica failed: %s", request_id, result)

    def _abort_chunk(self) -> StreamChunk:
        return StreamChunk(
            request_id=self.request_id, token_ids=[], text="", logprobs=[], finish_reason="abort",
            stop_reason=None, prompt_tokens=len(self.prompt_ids), completion_tokens=self.text.num_output_tokens)
