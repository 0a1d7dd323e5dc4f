"""A prefill replica: batches prompts, computes their KV, pushes it to decode.

1. Queue: the prompt joins the engine's scheduler, which batches prompts under the token budget
   and splits long ones into chunks (the same policy as continuous batching; a request here
   asks for one token, so it leaves right after its prompt). A prompt that finds the queue at
   its bound is refused at once (cluster.waiting_bound: RESOURCE_EXHAUSTED).
2. First token: sampled with the request's seed at position len(prompt), exactly what an
   uninterrupted run would sample; the request's blocks stay held (`hold_kv`). A resumed
   request (migrated off a failed replica) brings its output so far: its KV is computed after
   the prompt's, and the token sampled is the next one, at position len(prompt) + len(output).
3. Push: a `KVSender` copies the held blocks into the decode replica's reserved blocks and
   returns once decode acknowledged them. With a sender that streams layers (TRANSPORT_GRPC) the
   push starts during the forward pass of the last prompt chunk, each layer leaving as soon as
   it is computed (`LayerFeed`).
4. Release: the held blocks are freed, on success, failure or cancellation alike.

A request is in flight (for a drain) from the moment `run` starts until its push is done.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.waiting_bound import DEFAULT_MAX_WAITING_REQUESTS, check_waiting_room
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.config import model_id
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.kvtransfer.base import KVSender, TransferResult
from pdserve.kvtransfer.layout import make_layout
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.transports import create_sender
from pdserve.prefill_svc.layer_feed import LayerFeed
from pdserve.protocol.outputs import TokenLogprobs
from pdserve.protocol.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class PrefillReplicaConfig:
    engine: EngineConfig
    replica_id: str
    prefill_timeout_s: float = 300.0  # queueing plus compute of one prompt
    auth: InternalAuth = InternalAuth.open()  # what its KV transfers present to decode replicas
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS  # prompts queued, not yet started


@dataclass(frozen=True, slots=True)
class FirstToken:
    token_id: int
    logprobs: TokenLogprobs | None
    finish_reason: str | None  # set when this token already ends the request
    stop_reason: int | None  # the stop token id that ended it; None for EOS and length


class PrefillReplica:
    def __init__(self, config: PrefillReplicaConfig, loop: asyncio.AbstractEventLoop):
        self.config = config
        engine = LLMEngine(config.engine, kv_layer_listener=lambda request_id, block_ids, layer:
                           loop.call_soon_threadsafe(self._on_kv_layer, request_id, block_ids, layer))
        self.engine = AsyncEngine(engine, loop)
        self._feeds: dict[str, tuple[LayerFeed, KVTarget]] = {}
        self.layout = make_layout(model_id(config.engine.model), engine.kv_spec)
        self.kv_spec = engine.kv_spec
        self.kv_cache = engine.kv_cache
        self.queued_tokens = 0  # prompt tokens accepted but not yet prefilled, less those found cached
        self._num_running = 0  # `run`s between their start and their push's end
        self._senders: dict[int, KVSender] = {}

    def start(self) -> None:
        self.engine.start()

    async def stop(self) -> None:
        for sender in self._senders.values():
            await sender.close()
        await self.engine.stop()

    def engine_came_round_s(self) -> float:
        return self.engine.came_round_s

    def num_in_flight(self) -> int:
        return self._num_running

    async def load(self) -> dict[str, int]:
        """Figures for the replica registry: the engine's, read between steps, plus queued tokens."""
        return {**await self.engine.call(lambda engine: engine.load()), "queued_tokens": self.queued_tokens}

    async def cached_prefix_hashes(self, limit: int) -> list[bytes]:
        return await self.engine.call(lambda engine: engine.cached_prefix_hashes(limit))

    async def run(self, request_id: str, prompt_ids: list[int], params: SamplingParams, seed: int,
                  target: KVTarget, output_ids: list[int]) -> AsyncIterator[FirstToken | TransferResult]:
        """Yields the token after prompt + `output_ids` (the first token unless resumed), then the
        transfer result. Closing early aborts the request."""
        sender = self._sender(target.transport)
        num_tokens = len(prompt_ids) + len(output_ids)
        num_output = len(output_ids) + 1
        one_token = dataclasses.replace(params, max_tokens=num_output, min_tokens=min(params.min_tokens, num_output),
                                        stop=(), include_stop_str_in_output=False)
        stream = self.engine.open_stream(request_id)
        feed = None
        if sender.streams_layers:
            feed = LayerFeed(self.kv_spec.num_layers, self.config.prefill_timeout_s)
            self._feeds[request_id] = (feed, target)
        def add(engine: LLMEngine) -> int:
            check_waiting_room(len(engine.scheduler.waiting), self.config.max_waiting_requests)
            engine.add_request(request_id, prompt_ids, one_token, seed=seed, hold_kv=True, output_token_ids=output_ids)
            return num_tokens - engine.num_cached_tokens(request_id)

        self._num_running += 1
        num_queued = 0  # tokens to compute, counted in queued_tokens until the first token
        try:
            num_queued = await self.engine.call(add)
            self.queued_tokens += num_queued
            output = await asyncio.wait_for(stream.get(), self.config.prefill_timeout_s)
            if isinstance(output, Exception):
                raise output
            self.queued_tokens -= num_queued
            num_queued = 0
            completion = output.outputs[0]
            # Sampled under a budget of one more token, "length" ends the request only if that is its own.
            ends = completion.finish_reason == "stop" or params.max_tokens == num_output
            yield FirstToken(completion.token_ids[-1], completion.logprobs[-1] if completion.logprobs else None,
                             completion.finish_reason if ends else None, completion.stop_reason if ends else None)
            if feed is not None and feed.push is not None:
                yield await feed.push  # started during the forward pass
            else:
                yield await sender.send(request_id, self.kv_cache, output.held_block_ids[target.num_cached_blocks:],
                                        target)
        finally:
            self._num_running -= 1
            self.queued_tokens -= num_queued
            if feed is not None:
                self._feeds.pop(request_id, None)
                feed.cancel()
            self.engine.close_stream(request_id)
            # Releases held blocks after the push, or aborts a request still queued or running.
            self.engine.submit(lambda engine: engine.abort_request(request_id))

    async def abort(self, request_id: str) -> bool:
        return await self.engine.abort(request_id)

    def _on_kv_layer(self, request_id: str, block_ids: list[int], layer: int) -> None:
        if request_id not in self._feeds:
            return
        feed, target = self._feeds[request_id]
        sender = self._sender(target.transport)
        feed.announce(block_ids[target.num_cached_blocks:], layer, lambda ids, layers: sender.send(
            request_id, self.kv_cache, ids, target, layers_ready=layers))

    def _sender(self, transport: int) -> KVSender:
        if transport not in self._senders:
            self._senders[transport] = create_sender(transport, self.layout, self.config.auth.channel)
        return self._senders[transport]
