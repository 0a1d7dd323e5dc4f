"""The static-batching baseline: greedy output equal to transformers, batches fixed when they start."""
import asyncio

import openai
import pytest
import torch
from aiohttp.test_utils import TestServer
from transformers import AutoTokenizer

from pdserve.bench.static_server import BATCHER_KEY, BatchItem, StaticBatcher, create_static_app, generate_batch, load_model

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> str:
    return tiny_model()


@pytest.fixture(scope="module")
def model(model_dir):
    return load_model(model_dir, "float32")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def alone(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy generate on one unpadded prompt, run to max_tokens."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                         pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def test_a_padded_batch_gives_each_prompt_what_it_gets_alone(model, tokenizer):
    prompts = [tokenizer.encode(text) for text in ("hi", "a somewhat longer prompt with more tokens", "x y z")]
    items = [BatchItem(prompt, max_tokens, frozenset()) for prompt, max_tokens in zip(prompts, (MAX_TOKENS, 3, 5))]
    outputs = generate_batch(model, tokenizer.pad_token_id, items)
    assert [output.token_ids for output in outputs] == [alone(model, item.prompt_ids, item.max_tokens)
                                                      for item in items]
    assert [output.finish_reason for output in outputs] == ["length"] * 3


def test_a_row_ends_at_its_own_stop_token(model, tokenizer):
    prompt = tokenizer.encode("stop somewhere")
    expected = alone(model, prompt, MAX_TOKENS)
    stop_id = expected[3]
    outputs = generate_batch(model, tokenizer.pad_token_id, [BatchItem(prompt, MAX_TOKENS, frozenset({stop_id})),
                                                            BatchItem(prompt, MAX_TOKENS, frozenset())])
    assert outputs[0].token_ids == expected[:expected.index(stop_id) + 1]
    assert (outputs[0].finish_reason, outputs[0].stop_reason) == ("stop", stop_id)
    assert outputs[1].token_ids == expected


def test_concurrent_requests_form_batches_of_at_most_max_batch_size(model, tokenizer):
    async def scenario() -> list[int]:
        batcher = StaticBatcher(model, tokenizer.pad_token_id, max_batch_size=3)
        requests = [asyncio.ensure_future(batcher.submit(BatchItem([5 + n], 2, frozenset()))) for n in range(4)]
        await asyncio.sleep(0)  # all four are queued before the batch loop looks
        loop = asyncio.create_task(batcher.run())
        await asyncio.wait_for(asyncio.gather(*requests), timeout=60)
        loop.cancel()
        return batcher.batch_sizes

    assert asyncio.run(scenario()) == [3, 1]


def test_a_request_arriving_during_a_batch_waits_for_the_next(model, tokenizer):
    async def scenario() -> tuple[list[int], list[float]]:
        batcher = StaticBatcher(model, tokenizer.pad_token_id, max_batch_size=8)
        loop = asyncio.create_task(batcher.run())
        first = asyncio.ensure_future(batcher.submit(BatchItem([7] * 16, 48, frozenset())))
        while not batcher.batch_sizes:  # the first batch has started
            await asyncio.sleep(0.001)
        late = [asyncio.ensure_future(batcher.submit(BatchItem([9], 2, frozenset()))) for _ in range(2)]
        await asyncio.wait_for(asyncio.gather(first, *late), timeout=60)
        loop.cancel()
        return batcher.batch_sizes

    assert asyncio.run(scenario()) == [1, 2]


def test_requests_arriving_within_the_wait_share_a_batch(model, tokenizer):
    async def scenario(batch_wait_s: float) -> list[int]:
        batcher = StaticBatcher(model, tokenizer.pad_token_id, max_batch_size=4, batch_wait_s=batch_wait_s)
        loop = asyncio.create_task(batcher.run())
        requests = []
        for n in range(3):  # 3 ms apart, the way a client refills its concurrency
            requests.append(asyncio.ensure_future(batcher.submit(BatchItem([5 + n], 2, frozenset()))))
            await asyncio.sleep(0.003)
        await asyncio.wait_for(asyncio.gather(*requests), timeout=60)
        loop.cancel()
        return batcher.batch_sizes

    assert asyncio.run(scenario(batch_wait_s=0.3)) == [3]
    assert asyncio.run(scenario(batch_wait_s=0.0))[0] == 1


async def with_server(model, tokenizer, model_dir, scenario):
    """Runs `scenario(client, batcher)` against the static server's app on a real loopback socket."""
    app = create_static_app(model, tokenizer, model_dir, "tiny", max_batch_size=4)
    async with TestServer(app, host="127.0.0.1") as server:
        client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="unused", max_retries=0,
                                    timeout=60)
        return await scenario(client, app[BATCHER_KEY])


def test_the_http_api_answers_what_transformers_generates(model, tokenizer, model_dir):
    texts = ["hello there", "the static baseline", "batched"]
    common = dict(model="tiny", max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})

    async def streamed(client, text: str) -> tuple[str, int]:
        stream = await client.completions.create(prompt=text, stream=True, stream_options={"include_usage": True},
                                                 **common)
        chunks = [chunk async for chunk in stream]
        return "".join(c.text for chunk in chunks for c in chunk.choices), chunks[-1].usage.completion_tokens

    async def whole(client, prompt) -> str:
        return (await client.completions.create(prompt=prompt, **common)).choices[0].text

    async def scenario(client, batcher):
        answers = await asyncio.gather(*(streamed(client, text) for text in texts),
                                       whole(client, texts[0]), whole(client, tokenizer.encode(texts[1])))
        return answers, batcher.batch_sizes

    answers, batch_sizes = asyncio.run(with_server(model, tokenizer, model_dir, scenario))
    expected = [tokenizer.decode(alone(model, tokenizer.encode(text), MAX_TOKENS), skip_special_tokens=True)
                for text in texts]
    assert answers == [(text, MAX_TOKENS) for text in expected] + expected[:2]
    assert sum(batch_sizes) == 5 and max(batch_sizes) > 1  # concurrent requests shared batches


def test_sampling_is_refused_with_a_400(model, tokenizer, model_dir):
    async def scenario(client, batcher):
        with pytest.raises(openai.BadRequestError, match="greedy"):
            await client.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=0.7)
        return batcher.batch_sizes

    assert asyncio.run(with_server(model, tokenizer, model_dir, scenario)) == []
