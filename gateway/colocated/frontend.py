"""The `Frontend` contract over one in-process engine: prefill and decode in the same batch,
no Redis, no replicas. What `pdserve serve` runs, and the colocated baseline of the benchmarks.

The engine detokenizes and checks stop strings itself; closing the stream early aborts the
request, so its blocks come back.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from pdserve.engine.async_engine import AsyncEngine
from pdserve.gateway.front.frontend_types import GenerateInput, StreamChunk
from pdserve.gateway.front.metrics import GatewayMetrics, RequestTimeline
from pdserve.gateway.front.tokenization import PromptBuilder
from pdserve.protocol.outputs import RequestOutput


class ColocatedFrontend:
    def __init__(self, engine: AsyncEngine, prompts: PromptBuilder, metrics: GatewayMetrics, model_name: str,
                 token_timeout_s: float = 120.0):
        self.engine = engine
        self.prompts = prompts
        self.metrics = metrics
        self.model_name = model_name
        self.tokenizer = prompts.tokenizer
        self.max_model_len = prompts.max_model_len
        self.token_timeout_s = token_timeout_s
        self._live: dict[str, str] = {}  # request id -> its owner

    def health(self) -> bool:
        return True

    async def abort(self, request_id: str, owner: str) -> bool:
        return self._live.get(request_id) == owner and await self.engine.abort(request_id)

    async def generate(self, request: GenerateInput) -> AsyncIterator[StreamChunk]:
        request_id, prompt_ids, params = await self.prompts.prepare(request, self._live)
        started_s = last_s = time.monotonic()
        timeline = RequestTimeline(arrival_s=started_s)
        self.metrics.on_request_start()
        stream = self.engine.open_stream(request_id)
        self._live[request_id] = request.owner
        finished, reason, num_output = False, "abort", 0
        try:
            await self.engine.call(lambda engine: engine.add_request(request_id, prompt_ids, params))
            timeline.scheduled_s = time.monotonic()
            while not finished:
                output = await asyncio.wait_for(stream.get(), self.token_timeout_s)
                if isinstance(output, Exception):
                    raise output
                now_s = time.monotonic()
                if num_output == 0:
                    self.metrics.on_first_token(now_s - started_s)
                else:
                    self.metrics.on_token(now_s - last_s)
                last_s, finished = now_s, output.finished
                timeline.on_token(now_s)
                chunk = stream_chunk(output)
                num_output, reason = chunk.completion_tokens, chunk.finish_reason or reason
                yield chunk
        finally:
            self._live.pop(request_id, None)
            self.engine.close_stream(request_id)
            if not finished:
                self.engine.submit(lambda engine: engine.abort_request(request_id))
            self.metrics.on_finish(reason, len(prompt_ids), num_output, time.monotonic() - started_s, timeline)


def stream_chunk(output: RequestOutput) -> StreamChunk:
    """The client-facing chunk for one engine output (its new tokens and text)."""
    completion = output.outputs[0]
    return StreamChunk(
        request_id=output.request_id, token_ids=output.new_token_ids, text=output.new_text,
        logprobs=output.new_logprobs,
        finish_reason=completion.finish_reason if output.finished else None,
        stop_reason=completion.stop_reason if output.finished else None,
        prompt_tokens=len(output.prompt_token_ids), completion_tokens=output.num_output_tokens)
