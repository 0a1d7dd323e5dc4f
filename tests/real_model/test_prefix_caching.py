"""Prefix caching changes what the real SmolLM2-135M-Instruct computes, never what it generates.

tests/engine/test_prefix_caching.py on the real model and real text: six prompts behind one
200-token system prompt, then second turns that resend a first turn's prompt and answer, in
128-token prefill chunks. Greedy output with caching on equals output with it off, token for
token; the hits are counted; a pool small enough to preempt resumes from cached blocks with the
same output; and every block comes back (`run` checks it).
"""
import pytest

from tests.engine.test_prefix_caching import BLOCK_SIZE, make_engine, run

pytestmark = pytest.mark.real_model

SYSTEM_PROMPT_TOKENS = 200
TURN_LENGTHS = (1, 9, 16, 33, 50, 61)  # tokens after the system prompt


@pytest.fixture(scope="module")
def cases(corpus_ids) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens): the system prompt, then a passage of its own from later in the corpus."""
    system = corpus_ids[:SYSTEM_PROMPT_TOKENS]
    starts = range(600, 600 + 150 * len(TURN_LENGTHS), 150)
    assert starts[-1] + max(TURN_LENGTHS) <= len(corpus_ids)
    return [(system + corpus_ids[start:start + n], 6) for start, n in zip(starts, TURN_LENGTHS)]


def test_greedy_output_is_the_same_with_caching_on_and_off(smollm2_dir, cases):
    cached = make_engine(str(smollm2_dir), enable_prefix_caching=True)
    first_turns = run(cached, cases)
    second_cases = [(prompt + answer + turn[:5], 6) for (prompt, _), answer, (turn, _) in
                    zip(cases, first_turns, reversed(cases))]
    second_turns = run(cached, second_cases)

    uncached = make_engine(str(smollm2_dir), enable_prefix_caching=False)
    assert run(uncached, cases) == first_turns
    assert run(uncached, second_cases) == second_turns
    load = cached.load()
    assert load["prefix_cache_hits"] >= sum(len(prompt) // BLOCK_SIZE * BLOCK_SIZE for prompt, _ in cases)
    assert load["prefix_cache_queries"] == sum(len(prompt) for prompt, _ in cases + second_cases)


def test_preempted_requests_resume_from_their_cached_blocks_with_the_same_output(smollm2_dir, cases):
    tight = make_engine(str(smollm2_dir), enable_prefix_caching=True, num_blocks=40)  # 640 slots for 1,610 tokens
    longer = [(prompt, 40) for prompt, _ in cases]
    outputs = run(tight, longer)
    assert tight.scheduler.num_preemptions > 0
    assert outputs == run(make_engine(str(smollm2_dir), enable_prefix_caching=False), longer)
