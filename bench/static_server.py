"""The static-batching baseline: the traditional way to serve a model, behind the same OpenAI API.

    requests ──▶ waiting queue ──▶ [ batch of up to max_batch_size ] ──▶ one padded
                                     (what waited when the model         `model.generate`
                                      became free, plus what arrives     in a worker thread
                                      within batch_wait_ms)
                                                                              │
    each request's tokens, all at once ◀───────────────────────────────────────┘

Invariant: a batch is fixed when it starts. A batch that would start short of max_batch_size
first waits up to `batch_wait_ms` after its first request for more, as TorchServe's
`max_batch_delay` and Triton's `max_queue_delay_microseconds` do: without it, requests that arrive
a moment apart (a client refilling its concurrency as a batch ends) are split into a batch of one
and a batch of the rest. Prompts are left-padded to the longest one, the
batch runs greedily for the largest `max_tokens` in it, and only when the whole batch is done does
any request get a token. So every request's time to first token is its wait for the model plus
the whole batch's latency, short requests wait for the longest one, and a request arriving while
a batch runs waits for the next batch. That is the point of the baseline: it is what continuous
batching with chunked prefill (`pdserve serve`) and disaggregation (`pdserve up`) are measured
against.

The HTTP layer is the gateway's (`gateway.http_api`), so every system in a comparison answers
the same routes with the same bodies: POST /v1/completions (SSE or whole, prompt as text or token
ids, usage on request), /v1/models, /health, /metrics. Only greedy decoding (temperature 0) is
served; anything the padded batch cannot honour (sampling, stop strings, logprobs) is a 400.

    python -m bench.static_server --model DIR --port P [--max-batch-size N]
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch
from aiohttp import web
from transformers import AutoModelForCausalLM, AutoTokenizer

from pdserve.cluster.service_args import add_served_model_name_argument, served_model_name
from pdserve.engine.detokenizer import IncrementalDetokenizer
from pdserve.engine.errors import InvalidRequestError
from pdserve.gateway.frontend_types import GenerateInput, StreamChunk
from pdserve.gateway.http_api import create_app
from pdserve.gateway.http_server import serving_http, wait_for_stop_signal
from pdserve.gateway.metrics import GatewayMetrics
from pdserve.gateway.tokenization import PromptBuilder

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_BATCH_WAIT_MS = 50.0


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One request's share of a batch: what `generate_batch` needs to know about it."""

    prompt_ids: list[int]
    max_tokens: int
    stop_token_ids: frozenset[int]  # empty when the request ignores EOS


@dataclass(frozen=True, slots=True)
class BatchOutput:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    stop_reason: int | None  # the stop token that ended it


def generate_batch(model, pad_token_id: int, items: list[BatchItem]) -> list[BatchOutput]:
    """One padded greedy `model.generate` over `items`, cut back to each item's own stop.

    EOS handling is done here, after the fact: greedy tokens of one row do not depend on when the
    other rows stop, so generating to the batch's largest max_tokens and cutting each row at its
    first stop token gives each request exactly what it would get alone. `generate` is told only
    the stop tokens every item shares, so it ends early just when all rows have stopped. The
    model's own `generation_config.eos_token_id` must be None (see `load_model`), or `generate`
    would stop rows that ignore EOS.
    """
    num_prompt_tokens = max(len(item.prompt_ids) for item in items)
    input_ids = torch.full((len(items), num_prompt_tokens), pad_token_id, dtype=torch.long)  # [B, S]
    attention_mask = torch.zeros_like(input_ids)  # [B, S]
    for row, item in enumerate(items):
        input_ids[row, num_prompt_tokens - len(item.prompt_ids):] = torch.tensor(item.prompt_ids)
        attention_mask[row, num_prompt_tokens - len(item.prompt_ids):] = 1
    shared_stop_ids = frozenset.intersection(*(item.stop_token_ids for item in items))
    with torch.inference_mode():
        output_ids = model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=max(item.max_tokens for item in items),
            do_sample=False, pad_token_id=pad_token_id, eos_token_id=sorted(shared_stop_ids) or None,
        )  # [B, S + max_new_tokens or fewer]
    return [_cut(output_ids[row, num_prompt_tokens:].tolist(), item) for row, item in enumerate(items)]


def _cut(token_ids: list[int], item: BatchItem) -> BatchOutput:
    for index, token_id in enumerate(token_ids[:item.max_tokens]):
        if token_id in item.stop_token_ids:
            return BatchOutput(token_ids[:index + 1], "stop", token_id)
    return BatchOutput(token_ids[:item.max_tokens], "length", None)


@dataclass(frozen=True, slots=True)
class _Waiting:
    item: BatchItem
    done: asyncio.Future  # resolves to a BatchOutput


class StaticBatcher:
    """Queues requests and runs one batch at a time, each made of what waited when it started
    and what arrived in the following `batch_wait_s`, up to `max_batch_size`."""

    def __init__(self, model, pad_token_id: int, max_batch_size: int,
                 batch_wait_s: float = DEFAULT_BATCH_WAIT_MS / 1000):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must not be negative, got {batch_wait_s}")
        self._model = model
        self._pad_token_id = pad_token_id
        self._max_batch_size = max_batch_size
        self._batch_wait_s = batch_wait_s
        self._queue: asyncio.Queue[_Waiting] = asyncio.Queue()
        self.batch_sizes: list[int] = []  # one entry per batch run, in order

    async def _gather(self) -> list[_Waiting]:
        batch = [await self._queue.get()]
        deadline_s = asyncio.get_running_loop().time() + self._batch_wait_s
        while len(batch) < self._max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining_s = deadline_s - asyncio.get_running_loop().time()
            if remaining_s <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining_s))
            except TimeoutError:
                break
        return batch

    async def submit(self, item: BatchItem) -> BatchOutput:
        waiting = _Waiting(item, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(waiting)
        return await waiting.done

    async def run(self) -> None:
        """Forever: wait for a request, gather the batch behind it, run it."""
        while True:
            batch = await self._gather()
            batch = [waiting for waiting in batch if not waiting.done.cancelled()]
            if not batch:
                continue
            self.batch_sizes.append(len(batch))
            started_s = time.monotonic()
            try:
                outputs = await asyncio.to_thread(
                    generate_batch, self._model, self._pad_token_id, [waiting.item for waiting in batch])
            except Exception as exc:  # a failed batch fails its requests, not the server
                logger.exception("a batch of %d failed", len(batch))
                for waiting in batch:
                    if not waiting.done.done():
                        waiting.done.set_exception(exc)
                continue
            logger.debug("batch of %d in %.3f s", len(batch), time.monotonic() - started_s)
            for waiting, output in zip(batch, outputs):
                if not waiting.done.done():
                    waiting.done.set_result(output)


class StaticBatchFrontend:
    """The gateway's `Frontend` contract over a `StaticBatcher`: a request's chunks (one per
    token) all arrive together, once its batch has finished."""

    def __init__(self, batcher: StaticBatcher, prompts: PromptBuilder, metrics: GatewayMetrics, model_name: str):
        self.batcher = batcher
        self.prompts = prompts
        self.metrics = metrics
        self.model_name = model_name
        self.tokenizer = prompts.tokenizer
        self.max_model_len = prompts.max_model_len

    def health(self) -> bool:
        return True

    async def abort(self, request_id: str) -> bool:
        return False  # a running batch cannot drop a row; a waiting request is dropped when its client leaves

    async def generate(self, request: GenerateInput) -> AsyncIterator[StreamChunk]:
        request_id = request.request_id or uuid.uuid4().hex
        prompt_ids = self.prompts.prompt_ids(request)
        params = self.prompts.params(request, prompt_ids)
        if params.temperature != 0 or params.stop or params.logprobs is not None:
            raise InvalidRequestError(
                "the static-batching baseline serves greedy requests only (temperature 0, no stop "
                "strings, no logprobs)")
        stop_ids = frozenset() if params.ignore_eos else frozenset(
            {self.prompts.eos_token_id, *params.stop_token_ids} - {None})
        started_s = time.monotonic()
        self.metrics.on_request_start()
        reason, num_output = "abort", 0
        try:
            output = await self.batcher.submit(BatchItem(prompt_ids, params.max_tokens, stop_ids))
            self.metrics.on_first_token(time.monotonic() - started_s)
            detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_ids)
            for index, token_id in enumerate(output.token_ids):
                last = index == len(output.token_ids) - 1
                text = detokenizer.push([token_id]) + (detokenizer.finish() if last else "")
                if index:
                    self.metrics.on_token(0.0)
                num_output = index + 1
                reason = output.finish_reason if last else reason
                yield StreamChunk(
                    request_id=request_id, token_ids=[token_id], text=text, logprobs=[],
                    finish_reason=output.finish_reason if last else None,
                    stop_reason=output.stop_reason if last else None,
                    prompt_tokens=len(prompt_ids), completion_tokens=num_output)
        finally:
            self.metrics.on_finish(reason, len(prompt_ids), num_output, time.monotonic() - started_s)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    parser.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                        help=f"most requests in one generate call (default {DEFAULT_MAX_BATCH_SIZE})")
    parser.add_argument("--batch-wait-ms", type=float, default=DEFAULT_BATCH_WAIT_MS,
                        help="how long a batch short of --max-batch-size waits for more requests "
                             f"(default {DEFAULT_BATCH_WAIT_MS:g})")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    add_served_model_name_argument(parser)
    parser.add_argument("--log-level", default="INFO")


def load_model(model_dir: str, dtype: str):
    """The model in eval mode, its default EOS cleared so only `generate_batch` decides stops."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None
    return model


BATCHER_KEY = web.AppKey("batcher", StaticBatcher)


def create_static_app(model, tokenizer, model_dir: str, model_name: str, max_batch_size: int,
                      batch_wait_s: float = DEFAULT_BATCH_WAIT_MS / 1000) -> web.Application:
    """The OpenAI HTTP app over a `StaticBatcher`, whose batch loop runs while the app does."""
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    metrics = GatewayMetrics(model_name)
    prompts = PromptBuilder(tokenizer, model_dir, model.config.vocab_size, model.config.max_position_embeddings)
    batcher = StaticBatcher(model, pad_token_id, max_batch_size, batch_wait_s)
    app = create_app(StaticBatchFrontend(batcher, prompts, metrics, model_name), metrics)
    app[BATCHER_KEY] = batcher

    async def batch_loop(app: web.Application):
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()

    app.cleanup_ctx.append(batch_loop)
    return app


async def serve(args: argparse.Namespace) -> None:
    model_name = served_model_name(args)
    app = create_static_app(load_model(args.model, args.dtype), AutoTokenizer.from_pretrained(args.model),
                            args.model, model_name, args.max_batch_size, args.batch_wait_ms / 1000)
    async with serving_http(app, args.host, args.port):
        logger.info("static batching %s on http://%s:%d/v1 (batches of up to %d, gathered for up to %g ms, "
                    "%d torch threads)", model_name, args.host, args.port, args.max_batch_size,
                    args.batch_wait_ms, torch.get_num_threads())
        await wait_for_stop_signal()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.static_server", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s static %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
