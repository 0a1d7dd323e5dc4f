"""Fan-out of one OpenAI request into one engine request per choice: ids, derived seeds, and a
merged stream that starts only once every choice has, and closes every choice with it."""
import asyncio

import pytest

from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.gateway.front.fan_out import choice_inputs, merge
from pdserve.gateway.front.frontend_types import GenerateInput, StreamChunk


def prompt(text: str, seed: int | None = None) -> GenerateInput:
    return GenerateInput(request_id=None, prompt=text, params=SamplingParams(seed=seed))


def test_a_single_choice_keeps_the_request_id():
    [only] = choice_inputs((prompt("a", seed=3),), 1, "r")

    assert (only.request_id, only.params.seed) == ("r", 3)


def test_choices_are_numbered_prompt_major_and_seeded_seed_plus_sample_index():
    inputs = choice_inputs((prompt("a", seed=10), prompt("b", seed=10)), 2, "r")

    assert [(i.request_id, i.prompt, i.params.seed) for i in inputs] == [
        ("r-0", "a", 10), ("r-1", "a", 11), ("r-2", "b", 10), ("r-3", "b", 11),
    ]


def test_without_a_seed_every_choice_draws_its_own():
    assert [i.params.seed for i in choice_inputs((prompt("a"),), 3, "r")] == [None, None, None]


def chunk(text: str) -> StreamChunk:
    return StreamChunk(request_id="x", token_ids=[1], text=text, logprobs=[], finish_reason=None,
                       stop_reason=None, prompt_tokens=1, completion_tokens=1)


class Script:
    """A stream that, once released, yields its texts (then ends, or with `endless` waits for
    ever) or raises `error`; it records whether it was closed before its end."""

    def __init__(self, *texts: str, endless: bool = False, error: Exception | None = None):
        self.texts, self.endless, self.error = texts, endless, error
        self.release = asyncio.Event()
        self.closed_early = False

    async def stream(self):
        finished = False
        try:
            await self.release.wait()
            if self.error is not None:
                raise self.error
            for text in self.texts:
                yield chunk(text)
                await asyncio.sleep(0)
            if self.endless:
                await asyncio.Event().wait()
            finished = True
        finally:
            self.closed_early = not finished


async def collect(merged, count: int) -> list[tuple[int, str]]:
    return [(index, item.text) for index, item in [await anext(merged) for _ in range(count)]]


def test_nothing_is_yielded_until_every_choice_has_started():
    async def scenario():
        fast, slow = Script("f1", "f2"), Script("s1")
        merged = merge([fast.stream(), slow.stream()])
        first = asyncio.ensure_future(anext(merged))
        fast.release.set()
        await asyncio.sleep(0.01)
        assert not first.done()  # fast has two chunks ready, slow none yet
        slow.release.set()
        index, item = await first
        rest = await collect(merged, 2)
        assert await anext(merged, None) is None
        return [(index, item.text)] + rest

    pairs = asyncio.run(scenario())
    assert sorted(pairs) == [(0, "f1"), (0, "f2"), (1, "s1")]
    assert [text for index, text in pairs if index == 0] == ["f1", "f2"]


def test_an_error_in_one_choice_ends_the_merge_and_closes_the_others():
    async def scenario():
        endless, failing = Script(endless=True), Script(error=InvalidRequestError("bad prompt"))
        merged = merge([endless.stream(), failing.stream()])
        endless.release.set()
        failing.release.set()
        with pytest.raises(InvalidRequestError, match="bad prompt"):
            await anext(merged)
        return endless

    assert asyncio.run(scenario()).closed_early


def test_closing_the_merge_closes_every_unfinished_choice():
    async def scenario():
        scripts = [Script(endless=True), Script("a", endless=True)]
        merged = merge([script.stream() for script in scripts])
        pending = asyncio.ensure_future(anext(merged))
        await asyncio.sleep(0.01)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await merged.aclose()
        return scripts

    assert [script.closed_early for script in asyncio.run(scenario())] == [True, True]
