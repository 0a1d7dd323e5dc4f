"""The gateway core: one request's journey through a decode and a prefill replica.

    1. tokenize, fit parameters, record QUEUED
    2. route: decode = most free KV blocks, prefill = fewest queued prompt tokens; pick transport
    3. Decode.Reserve → KVTarget (blocks reserved on D)                      state PREFILLING
    4. Prefill.Run(prompt, KVTarget): first token streams back at once      state TRANSFERRING
       and P pushes the KV into D's blocks; the call ends when D has it
    5. Decode.Generate(first token) streams the rest                        state DECODING
    6. detokenize incrementally here, check stop strings, stream chunks     state FINISHED
Whatever way it ends early (client gone, Abort, a stop string, a failure), the reservation and
any running work are aborted on both replicas, so every KV block comes back.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from engine.errors import InvalidRequestError, PdserveError
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.request import Request
from gateway.channels import ChannelPool
from gateway.frontend_types import GenerateInput, StreamChunk, UnavailableError
from gateway.metrics import GatewayMetrics, RequestTimeline
from gateway.registry import LiveReplicas
from gateway.request_state import RequestState
from gateway.request_store import RequestStore
from gateway.router import NoReplicaError, Router
from gateway.tokenization import PromptBuilder
from kvtransfer.choice import choose_transport, transport_name
from kvtransfer.errors import TransportUnavailableError
from pdserve.protocol import logprobs_from_proto, params_to_proto
from pdserve.v1 import decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc

logger = logging.getLogger(__name__)


class AbortedError(PdserveError):
    """The request was aborted through the API while the gateway drove it."""


class BackendError(UnavailableError):
    """A replica refused or failed a call; `grpc_code` is the status the client should see."""

    def __init__(self, grpc_code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.grpc_code = grpc_code


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    model_name: str
    forced_transport: int | None = None  # None: choose from the replicas' host and device
    rpc_timeout_s: float = 30.0  # Reserve, Abort
    request_timeout_s: float = 600.0  # a whole Prefill.Run or Decode.Generate stream


class GatewayFrontend:
    def __init__(self, config: FrontendConfig, prompts: PromptBuilder, replicas: LiveReplicas,
                 store: RequestStore, metrics: GatewayMetrics):
        self.config = config
        self.model_name = config.model_name
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self.max_model_len = prompts.max_model_len
        self.replicas = replicas
        self.store = store
        self.metrics = metrics
        self.router = Router()
        self.channels = ChannelPool()
        self._live: dict[str, tuple[str, str]] = {}  # request id -> (prefill, decode) endpoints
        self._aborted: set[str] = set()
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
        if request_id not in self._live:
            return False
        self._aborted.add(request_id)
        await self._abort_on_replicas(request_id)
        return True

    async def generate(self, request: GenerateInput) -> AsyncIterator[StreamChunk]:
        request_id, prompt_ids, params = self.prompts.prepare(request, self._live)
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        started_s = time.monotonic()
        await self.store.create(request_id, len(prompt_ids))
        self.metrics.on_request_start()
        self._live[request_id] = ("", "")
        journey = _Journey(self, request_id, prompt_ids, params, seed, started_s)
        try:
            async for chunk in journey.run():
                yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            await journey.end(RequestState.ABORTED, "abort", "client went away")
            raise
        except Exception as exc:
            if request_id not in self._aborted:
                await journey.end(RequestState.FAILED, "error", str(exc) or repr(exc))
                raise
            await journey.end(RequestState.ABORTED, "abort", "aborted")
            yield journey.final_chunk("abort")
        finally:
            self._live.pop(request_id, None)
            self._aborted.discard(request_id)

    async def close(self) -> None:
        await self.channels.close()

    async def _abort_on_replicas(self, request_id: str) -> None:
        prefill, decode = self._live.get(request_id, ("", ""))
        calls = []
        if decode:
            stub = decode_pb2_grpc.DecodeStub(self.channels.get(decode))
            calls.append(stub.Abort(decode_pb2.DecodeAbortRequest(request_id=request_id),
                                    timeout=self.config.rpc_timeout_s))
        if prefill:
            stub = prefill_pb2_grpc.PrefillStub(self.channels.get(prefill))
            calls.append(stub.Abort(prefill_pb2.PrefillAbortRequest(request_id=request_id),
                                    timeout=self.config.rpc_timeout_s))
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, Exception):
                logger.warning("abort of %s on a replica failed: %s", request_id, result)


class _Journey:
    """The state of one request while the gateway drives it."""

    def __init__(self, frontend: GatewayFrontend, request_id: str, prompt_ids: list[int], params, seed: int,
                 started_s: float):
        self.frontend = frontend
        self.request_id = request_id
        self.request = Request(request_id, prompt_ids, params, seed)
        self.processor = OutputProcessor(frontend.tokenizer, frontend.prompts.eos_token_id)
        self.processor.add(self.request)
        self.started_s = started_s
        self.timeline = RequestTimeline(arrival_s=started_s)
        self.last_token_s = started_s
        self.last_token_itl_s = 0.0
        self.finished = False

    async def run(self) -> AsyncIterator[StreamChunk]:
        frontend, config = self.frontend, self.frontend.config
        request_id, prompt_ids = self.request_id, self.request.prompt_token_ids
        decode, prefill, transport = await self._route()
        frontend._live[request_id] = (prefill.endpoint, decode.endpoint)
        decode_stub = decode_pb2_grpc.DecodeStub(frontend.channels.get(decode.endpoint))
        prefill_stub = prefill_pb2_grpc.PrefillStub(frontend.channels.get(prefill.endpoint))

        target = await self._call(decode.replica_id, decode_stub.Reserve(decode_pb2.ReserveRequest(
            request_id=request_id, num_prompt_tokens=len(prompt_ids), transport=transport),
            timeout=config.rpc_timeout_s))
        await self._transition(RequestState.PREFILLING, prefill_replica=prefill.replica_id,
                               decode_replica=decode.replica_id, transport=transport_name(transport))
        params_msg = params_to_proto(self.request.params)
        self.timeline.scheduled_s = time.monotonic()
        events = prefill_stub.Run(prefill_pb2.PrefillRequest(
            request_id=request_id, prompt_token_ids=prompt_ids, params=params_msg, seed=self.request.seed,
            target=target), timeout=config.request_timeout_s)
        first = await self._next_event(prefill.replica_id, events, "first_token")
        logprobs = logprobs_from_proto(first.logprob) if first.HasField("logprob") else None
        output, stopped = self._accept(first.token_id, logprobs)
        frontend.metrics.on_first_token(self.last_token_s - self.started_s)
        yield self._chunk(output)
        await self._transition(RequestState.TRANSFERRING)
        done = await self._next_event(prefill.replica_id, events, "transfer_done")
        frontend.metrics.on_kv_transfer(transport_name(done.transport), done.kv_bytes, done.kv_transfer_s)
        await frontend.store.update(request_id, kv_bytes=done.kv_bytes, kv_transfer_s=done.kv_transfer_s)
        if stopped:
            await frontend._abort_on_replicas(request_id)  # releases the unused reservation
            await self.end(RequestState.FINISHED, output.outputs[0].finish_reason, "")
            return

        await self._transition(RequestState.DECODING)
        stream = decode_stub.Generate(decode_pb2.DecodeRequest(
            request_id=request_id, prompt_token_ids=prompt_ids, params=params_msg, seed=self.request.seed,
            first_token_id=first.token_id), timeout=config.request_timeout_s)
        try:
            async for chunk in self._decode_chunks(decode.replica_id, stream):
                for i, token_id in enumerate(chunk.token_ids):
                    logprobs = logprobs_from_proto(chunk.logprobs[i]) if chunk.logprobs else None
                    output, stopped = self._accept(token_id, logprobs)
                    frontend.metrics.on_token(self.last_token_itl_s)
                    yield self._chunk(output)
                    if stopped:
                        break
                if stopped:
                    break
        finally:
            stream.cancel()  # no-op once the stream ended; after a stop string it aborts on decode
        if not stopped:
            raise BackendError(grpc.StatusCode.INTERNAL,
                               f"decode replica {decode.replica_id} ended the stream before the request finished")
        frontend.metrics.on_preemptions(chunk.num_preemptions)
        await self.end(RequestState.FINISHED, output.outputs[0].finish_reason, "")

    async def end(self, state: RequestState, reason: str, error: str) -> None:
        """Records how the request ended, once; aborts leftovers on the replicas unless finished."""
        if self.finished:
            return
        self.finished = True
        frontend = self.frontend
        if state is not RequestState.FINISHED:
            with contextlib.suppress(Exception):
                await asyncio.shield(frontend._abort_on_replicas(self.request_id))
        num_output = len(self.request.output_token_ids)
        frontend.metrics.on_finish(reason, self.request.num_prompt_tokens, num_output,
                                   time.monotonic() - self.started_s, self.timeline)
        try:
            await asyncio.shield(frontend.store.transition(
                self.request_id, state, completion_tokens=num_output, error=error))
        except Exception as exc:
            logger.warning("request %s: could not record %s: %s", self.request_id, state.name, exc)

    async def _route(self):
        frontend = self.frontend
        decodes, prefills = await asyncio.gather(frontend.replicas.list("decode"), frontend.replicas.list("prefill"))
        try:
            decode = frontend.router.pick_decode(decodes, self.request.num_prompt_tokens)
            prefill = frontend.router.pick_prefill(prefills)
        except NoReplicaError as exc:
            raise UnavailableError(str(exc)) from exc
        try:
            transport = choose_transport(prefill.host_id, prefill.device, decode.host_id, decode.device,
                                         frontend.config.forced_transport)
        except TransportUnavailableError as exc:
            raise BackendError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
        frontend.router.note_dispatched(decode, self.request.num_prompt_tokens)
        frontend.router.note_dispatched(prefill, self.request.num_prompt_tokens)
        return decode, prefill, transport

    def _accept(self, token_id: int, logprobs) -> tuple[RequestOutput, bool]:
        self.request.output_token_ids.append(token_id)
        output, decision = self.processor.process(self.request_id, token_id, logprobs)
        now_s = time.monotonic()
        self.last_token_itl_s, self.last_token_s = now_s - self.last_token_s, now_s
        self.timeline.on_token(now_s)
        return output, decision is not None

    def _chunk(self, output: RequestOutput) -> StreamChunk:
        return stream_chunk(output)

    def final_chunk(self, finish_reason: str) -> StreamChunk:
        return StreamChunk(
            request_id=self.request_id, token_ids=[], text="", logprobs=[], finish_reason=finish_reason,
            stop_reason=None, prompt_tokens=self.request.num_prompt_tokens,
            completion_tokens=len(self.request.output_token_ids))

    async def _transition(self, state: RequestState, **fields) -> None:
        if self.request_id in self.frontend._aborted:
            raise AbortedError(f"request {self.request_id} was aborted")
        await self.frontend.store.transition(self.request_id, state, **fields)

    async def _call(self, replica_id: str, call):
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise _backend_error(replica_id, exc) from exc

    async def _next_event(self, replica_id: str, events, expected: str):
        try:
            event = await events.read()
        except grpc.aio.AioRpcError as exc:
            raise _backend_error(replica_id, exc) from exc
        if event is grpc.aio.EOF or event.WhichOneof("event") != expected:
            raise BackendError(grpc.StatusCode.INTERNAL, f"prefill replica {replica_id}: expected {expected}")
        return getattr(event, expected)

    async def _decode_chunks(self, replica_id: str, stream):
        try:
            async for chunk in stream:
                yield chunk
        except grpc.aio.AioRpcError as exc:
            raise _backend_error(replica_id, exc) from exc


def stream_chunk(output: RequestOutput) -> StreamChunk:
    """The client-facing chunk for one engine output (its new tokens and text)."""
    completion = output.outputs[0]
    new_logprobs = completion.logprobs[-len(output.new_token_ids):] if completion.logprobs else []
    return StreamChunk(
        request_id=output.request_id, token_ids=output.new_token_ids, text=output.new_text,
        logprobs=[lp for lp in new_logprobs if lp is not None],
        finish_reason=completion.finish_reason if output.finished else None,
        stop_reason=completion.stop_reason if output.finished else None,
        prompt_tokens=len(output.prompt_token_ids), completion_tokens=len(completion.token_ids))


def _backend_error(replica_id: str, exc: grpc.aio.AioRpcError) -> Exception:
    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequestError(exc.details())
    return BackendError(exc.code(), f"{replica_id}: {exc.details()}")
