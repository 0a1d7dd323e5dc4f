"""Prefix caching changes what is computed, never what is generated.

The workload shares prefixes the way chat traffic does: many prompts behind one long system
prompt, and second turns that resend the first turn's prompt and answer. Greedy output with
caching on equals output with it off and transformers', token for token, with chunked prefill
and a pool small enough to preempt; the hits are counted, and every block comes back.
"""
import torch

from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.sampling_params import SamplingParams

SYSTEM_PROMPT_TOKENS = 200
BLOCK_SIZE = 16


def run(engine: LLMEngine, cases: list[tuple[list[int], int]]) -> list[list[int]]:
    for i, (prompt, max_tokens) in enumerate(cases):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    outputs = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = output.outputs[0].token_ids
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
    return [outputs[str(i)] for i in range(len(cases))]


def make_engine(model_dir: str, enable_prefix_caching: bool, num_blocks: int = 256) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=model_dir, dtype="float32", block_size=BLOCK_SIZE, num_gpu_blocks=num_blocks,
        max_num_batched_tokens=128, max_num_seqs=8, enable_prefix_caching=enable_prefix_caching))


def shared_prefix_cases(vocab_size: int) -> list[tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(7)
    tokens = lambda n: torch.randint(0, vocab_size, (n,), generator=generator).tolist()  # noqa: E731
    system = tokens(SYSTEM_PROMPT_TOKENS)
    return [(system + tokens(n), 6) for n in (1, 9, 16, 33, 50, 61)]


def test_greedy_output_is_the_same_with_caching_on_and_off_and_equals_transformers(tiny_model, hf_greedy):
    model_dir = tiny_model(arch="llama")
    cached = make_engine(model_dir, enable_prefix_caching=True)
    cases = shared_prefix_cases(cached.model_config.vocab_size)

    first_turns = run(cached, cases)
    second_cases = [(prompt + answer + turn[:5], 6) for (prompt, _), answer, (turn, _) in
                    zip(cases, first_turns, reversed(cases))]
    second_turns = run(cached, second_cases)

    uncached = make_engine(model_dir, enable_prefix_caching=False)
    assert run(uncached, cases) == first_turns
    assert run(uncached, second_cases) == second_turns
    assert first_turns + second_turns == hf_greedy(model_dir, cases + second_cases)

    # Every second turn finds at least the full blocks of its first turn's prompt (the pool holds
    # all of it: nothing is evicted); first turns add what they find of the system prompt.
    load = cached.load()
    assert load["prefix_cache_hits"] >= sum(len(prompt) // BLOCK_SIZE * BLOCK_SIZE for prompt, _ in cases)
    assert load["prefix_cache_queries"] == sum(len(prompt) for prompt, _ in cases + second_cases)
    assert uncached.load()["prefix_cache_hits"] == 0


def test_preempted_requests_resume_from_their_cached_blocks_with_the_same_output(tiny_model):
    model_dir = tiny_model(arch="llama")
    tight = make_engine(model_dir, enable_prefix_caching=True, num_blocks=40)  # 640 slots for ~1600
    cases = [(prompt, 40) for prompt, _ in shared_prefix_cases(tight.model_config.vocab_size)]
    outputs = run(tight, cases)
    assert tight.scheduler.num_preemptions > 0
    assert outputs == run(make_engine(model_dir, enable_prefix_caching=False), cases)
