"""Several choices of one HTTP request as one stream, on top of the `Frontend` protocol.

An OpenAI request asks for `n` choices of each of its prompts. Each choice is its own engine
request, so the choices of a request run side by side in the engines' batches:

    choice index = prompt index * n + sample index           (the order vLLM numbers them in)
    engine request id = the request's id, or "<id>-<choice index>" when it has several choices
    seed of sample j = seed + j (as vLLM derives its children's seeds); no seed: each draws its own

`merge` interleaves the choices' streams as their chunks arrive, tagged with their choice index.
It holds back everything until every choice has sent its first chunk, so input the frontend
rejects (one bad prompt of a list) fails the whole request before any byte of it is sent.
Closing the merged stream closes every choice's stream, which aborts the unfinished ones, and
waits (up to CLOSE_DEADLINE_S) until they are closed, even if the closing task is cancelled again.
"""
import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

from pdserve.gateway.front.frontend_types import GenerateInput, StreamChunk
from pdserve.gateway.front.run_to_end import run_to_end

CLOSE_DEADLINE_S = 60.0
"""Longest the choices' streams may take to close (each ends its request on the replicas)."""


def choice_inputs(prompts: tuple[GenerateInput, ...], n: int, request_id: str) -> list[GenerateInput]:
    """One input per choice, in choice-index order, each with its own engine request id and seed."""
    single = len(prompts) * n == 1
    inputs = []
    for prompt_index, prompt in enumerate(prompts):
        for sample_index in range(n):
            index = prompt_index * n + sample_index
            seed = prompt.params.seed
            params = prompt.params if seed is None else dataclasses.replace(prompt.params, seed=seed + sample_index)
            inputs.append(dataclasses.replace(
                prompt, request_id=request_id if single else f"{request_id}-{index}", params=params))
    return inputs


async def merge(streams: list[AsyncIterator[StreamChunk]]) -> AsyncIterator[tuple[int, StreamChunk]]:
    """(choice index, chunk) pairs from all `streams`; a stream's error ends the merged stream."""
    queue: asyncio.Queue[tuple[int, StreamChunk | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[StreamChunk]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    queue.put_nowait((index, chunk))
        except Exception as exc:
            queue.put_nowait((index, exc))
        else:
            queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        held: list[tuple[int, StreamChunk]] = []
        started: set[int] = set()
        num_open = len(streams)
        while num_open:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                num_open -= 1
                continue
            if len(started) == len(streams):
                yield index, item
                continue
            started.add(index)
            held.append((index, item))
            if len(started) == len(streams):
                for pair in held:
                    yield pair
                held.clear()
        for pair in held:  # some stream ended without a chunk: let the caller judge what came
            yield pair
    finally:
        for task in tasks:
            task.cancel()
        await run_to_end(asyncio.gather(*tasks, return_exceptions=True), CLOSE_DEADLINE_S, "closing the choices")
