"""The engine's two disaggregation roles, in one process: a prefill engine computes a prompt's
KV and first token and holds the blocks; the blocks are copied into a decode engine's
reservation; decode continues. The tokens equal one uninterrupted run, sampled ones included,
and both pools end with every block free."""
import dataclasses

import pytest

from pdserve.engine import SamplingParams
from pdserve.engine.engine_config import EngineConfig
from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.structured_output import StructuredOutput
from pdserve.engine.llm_engine import LLMEngine


ITEM = {"type": "object", "properties": {"id": {"type": "integer"}, "label": {"type": "string", "maxLength": 9}},
        "required": ["id", "label"]}


@pytest.fixture(scope="module")
def engines(tiny_model):
    model_dir = tiny_model()
    prefill = LLMEngine(EngineConfig(model=model_dir, num_gpu_blocks=64, block_size=16))
    decode = LLMEngine(EngineConfig(model=model_dir, num_gpu_blocks=96, block_size=16, detokenize=False))
    reference = LLMEngine(EngineConfig(model=model_dir, num_gpu_blocks=64, block_size=16))
    return prefill, decode, reference


def run_to_end(engine: LLMEngine, request_id: str) -> list[int]:
    tokens = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id == request_id and output.finished:
                tokens = output.outputs[0].token_ids
    return tokens


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=20, temperature=0, ignore_eos=True),
    SamplingParams(max_tokens=20, temperature=0.8, top_k=50, ignore_eos=True),
    SamplingParams(max_tokens=20, temperature=0.8, top_k=50, ignore_eos=True, presence_penalty=1.0,
                   frequency_penalty=0.5, repetition_penalty=1.5, logit_bias={120: 3.0}),
    SamplingParams(max_tokens=20, temperature=0.8, min_tokens=5, stop_token_ids=[2], logit_bias={2: 100.0}),
    SamplingParams(max_tokens=60, temperature=0.8, structured_output=StructuredOutput(json=ITEM)),
], ids=["greedy", "sampled", "penalised", "min_tokens", "structured"])
def test_handoff_equals_an_uninterrupted_run(engines, params):
    prefill, decode, reference = engines
    prompt = list(range(100, 137))
    seed = 4242

    reference.add_request("r", prompt, params, seed=seed)
    expected = run_to_end(reference, "r")

    first_only = dataclasses.replace(params, max_tokens=1, min_tokens=min(params.min_tokens, 1))
    prefill.add_request("r", prompt, first_only, seed=seed, hold_kv=True)
    output = prefill.step()[0]
    assert output.finished and output.held_block_ids
    first_token = output.outputs[0].token_ids[0]

    reserved, _ = decode.reserve("r", len(prompt))
    decode.kv_cache[:, :, reserved] = prefill.kv_cache[:, :, output.held_block_ids]
    assert prefill.release_kv("r")
    decode.add_prefilled_request("r", prompt, first_token, params, seed)
    continued = run_to_end(decode, "r")

    assert continued == expected
    if params.min_tokens:
        assert expected[params.min_tokens:] == [2]  # the forced stop token, held off until then
    for engine in (prefill, decode, reference):
        assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=20, temperature=0.8, top_k=50, ignore_eos=True, presence_penalty=1.0,
                   frequency_penalty=0.5, repetition_penalty=1.5, logit_bias={120: 3.0}),
    SamplingParams(max_tokens=20, temperature=0.8, min_tokens=9, stop_token_ids=[2], logit_bias={2: 100.0}),
    SamplingParams(max_tokens=60, temperature=0.8, structured_output=StructuredOutput(json=ITEM)),
], ids=["penalised", "min_tokens", "structured"])
def test_a_request_resumed_with_its_output_so_far_equals_an_uninterrupted_run(engines, params):
    """What a migration does: prefill computes prompt + the first 6 output tokens as KV, with
    those tokens counted as output (penalties, min_tokens), samples the 7th, and a decode engine
    carries on from there (a structured output's grammar replays those tokens on both)."""
    prefill, decode, reference = engines
    prompt = list(range(100, 137))
    seed = 99
    reference.add_request("r", prompt, params, seed=seed)
    expected = run_to_end(reference, "r")
    streamed = expected[:6]

    next_only = dataclasses.replace(params, max_tokens=7, min_tokens=min(params.min_tokens, 7))
    prefill.add_request("r", prompt, next_only, seed=seed, hold_kv=True, output_token_ids=streamed)
    output = prefill.step()[0]
    assert output.finished and output.outputs[0].token_ids == expected[:7]

    reserved, _ = decode.reserve("r", len(prompt) + len(streamed))
    decode.kv_cache[:, :, reserved] = prefill.kv_cache[:, :, output.held_block_ids]
    assert prefill.release_kv("r")
    decode.add_prefilled_request("r", prompt, expected[6], params, seed, output_token_ids=streamed)
    assert run_to_end(decode, "r") == expected
    for engine in (prefill, decode, reference):
        assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_a_decode_reservation_starts_from_its_cached_prefix_and_receives_only_the_rest(engines):
    prefill, decode, reference = engines
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    system = list(range(300, 340))  # two full blocks and 8 tokens
    for request_id, prompt, want_cached in (("first", system + [1, 2, 3], 0), ("second", system + [7, 8, 9, 10], 2)):
        reference.add_request(request_id, prompt, params)
        expected = run_to_end(reference, request_id)
        prefill.add_request(request_id, prompt, dataclasses.replace(params, max_tokens=1), hold_kv=True)
        output = prefill.step()[0]

        table, num_cached = decode.reserve(request_id, len(prompt), prompt)
        assert num_cached == want_cached
        assert decode.load()["prefix_cache_hits"] >= num_cached * 16
        decode.kv_cache[:, :, table[num_cached:]] = prefill.kv_cache[:, :, output.held_block_ids[num_cached:]]
        assert prefill.release_kv(request_id)
        decode.add_prefilled_request(request_id, prompt, output.outputs[0].token_ids[0], params, seed=0)
        assert run_to_end(decode, request_id) == expected
    assert decode.allocator.num_free_blocks == decode.allocator.num_blocks


def test_unused_reservation_is_released(engines):
    _, decode, _ = engines
    decode.reserve("never-joined", 40)
    assert decode.allocator.num_free_blocks == decode.allocator.num_blocks - 3
    assert decode.release_kv("never-joined")
    assert not decode.release_kv("never-joined")
    assert decode.allocator.num_free_blocks == decode.allocator.num_blocks


@pytest.mark.parametrize("num_tokens", [0, "beyond max_model_len"])
def test_a_reservation_the_context_cannot_hold_is_refused_and_holds_nothing(engines, num_tokens):
    _, decode, _ = engines
    num_tokens = decode.max_model_len + 1 if num_tokens == "beyond max_model_len" else num_tokens
    with pytest.raises(InvalidRequestError, match="context length"):
        decode.reserve("too-long", num_tokens)
    assert decode.allocator.num_free_blocks == decode.allocator.num_blocks
    assert not decode.release_kv("too-long")


def test_layer_listener_hears_each_layer_of_a_held_request_while_the_forward_pass_runs(tiny_model):
    engine = LLMEngine(EngineConfig(model=tiny_model(), num_gpu_blocks=64, block_size=16,
                                    max_num_batched_tokens=32))
    heard = []

    def written(layer: int, block_id: int) -> bool:
        return layer < engine.kv_cache.shape[0] and bool(engine.kv_cache[layer, :, block_id].abs().sum() > 0)

    def listener(request_id, block_ids, layer):
        # The last chunk (positions 64..69) fills only the last block.
        heard.append((request_id, layer, list(block_ids), written(layer, block_ids[-1]),
                      written(layer + 1, block_ids[-1])))

    engine.kv_layer_listener = listener
    engine.add_request("held", list(range(100, 170)), SamplingParams(max_tokens=1), hold_kv=True)  # 3 chunks
    engine.add_request("plain", list(range(200, 210)), SamplingParams(max_tokens=1))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    held = next(o for o in outputs if o.request_id == "held")

    num_layers = engine.kv_cache.shape[0]
    assert [(rid, layer) for rid, layer, *_ in heard] == [("held", layer) for layer in range(num_layers)]
    assert all(block_ids == held.held_block_ids for _, _, block_ids, _, _ in heard)
    assert all(written and not later for *_, written, later in heard)  # heard mid-pass, not after
    assert engine.release_kv("held")
