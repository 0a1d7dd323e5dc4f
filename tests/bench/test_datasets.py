"""Datasets: lengths as asked, the seed fixes the prompts, "prompt-heavy" has its spread of
prompts, "words" draws distinct prompts of whole words."""
import json

import pytest

from pdserve.bench.datasets import PROMPT_HEAVY_INPUT_LENS, BenchRequest, make_dataset
from pdserve.bench.errors import BenchConfigError


def test_random_lengths_stay_within_the_range_ratio():
    requests = make_dataset("random", num_prompts=400, seed=1, input_len=100, output_len=20,
                            range_ratio=0.5, vocab_size=1000)
    input_lens = [len(request.prompt_token_ids) for request in requests]
    output_lens = [request.output_len for request in requests]
    assert min(input_lens) >= 50 and max(input_lens) <= 150
    assert min(output_lens) >= 10 and max(output_lens) <= 30
    assert len(set(input_lens)) > 20  # actually spread, not one length
    assert all(0 <= token_id < 1000 for request in requests for token_id in request.prompt_token_ids)


def test_zero_range_ratio_gives_exact_lengths_and_distinct_prompts():
    requests = make_dataset("random", num_prompts=10, seed=0, input_len=32, output_len=7, vocab_size=500)
    assert {len(request.prompt_token_ids) for request in requests} == {32}
    assert {request.output_len for request in requests} == {7}
    assert len({tuple(request.prompt_token_ids) for request in requests}) == 10


def test_same_seed_same_dataset():
    def make(seed):
        return make_dataset("random", num_prompts=30, seed=seed, input_len=20, output_len=5, range_ratio=0.3,
                            vocab_size=300)

    assert make(5) == make(5)
    assert make(5) != make(6)


def test_with_a_tokenizer_each_request_also_carries_its_text_and_no_special_ids(tiny_model):
    from pdserve.protocol.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_model())
    requests = make_dataset("random", num_prompts=3, seed=0, input_len=40, output_len=4, tokenizer=tokenizer)
    special_ids = set(tokenizer.all_special_ids)
    for request in requests:
        assert request.prompt == tokenizer.decode(request.prompt_token_ids)
        assert not special_ids & set(request.prompt_token_ids)


def test_words_prompts_count_words_within_the_range_are_distinct_and_tokenized(tiny_model):
    from pdserve.protocol.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_model())
    requests = make_dataset("words", num_prompts=40, seed=3, input_len=20, output_len=8, range_ratio=0.5,
                            tokenizer=tokenizer)
    assert all(10 <= len(request.prompt.split()) <= 30 for request in requests)
    assert len({request.prompt.split()[0] for request in requests}) > 20  # no shared prefix
    assert {request.output_len for request in requests} == {8}
    for request in requests:
        assert request.prompt_token_ids == tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
    assert requests == make_dataset("words", num_prompts=40, seed=3, input_len=20, output_len=8, range_ratio=0.5,
                                    tokenizer=tokenizer)
    with pytest.raises(BenchConfigError, match="needs a tokenizer"):
        make_dataset("words", num_prompts=1, seed=0, vocab_size=100)


def test_random_needs_a_tokenizer_or_a_vocab_size():
    with pytest.raises(BenchConfigError, match="tokenizer or a vocab_size"):
        make_dataset("random", num_prompts=2, seed=0)


def test_prompt_heavy_spreads_prompts_over_its_whole_range_with_fixed_outputs():
    low, high = PROMPT_HEAVY_INPUT_LENS
    requests = make_dataset("prompt-heavy", num_prompts=500, seed=3, input_len=8, output_len=64, vocab_size=100)
    input_lens = [len(request.prompt_token_ids) for request in requests]
    assert low <= min(input_lens) < low + 20 and high - 20 < max(input_lens) <= high  # input_len plays no part
    assert sum(input_lens) / len(input_lens) == pytest.approx((low + high) / 2, rel=0.1)
    assert {request.output_len for request in requests} == {64}


@pytest.mark.parametrize("kind", ["random", "prompt-heavy"])
def test_every_kind_is_fixed_by_its_seed(kind):
    def make(seed):
        return make_dataset(kind, num_prompts=20, seed=seed, input_len=16, output_len=32, vocab_size=100)

    assert make(7) == make(7)
    assert make(7) != make(8)
