"""A benchmark's trace: what is sent (`make_dataset`) and when (`arrival_offsets_s`), both pure
functions of their arguments and seed.

- "random": `input_len` ± `range_ratio` random token ids per prompt (the tokenizer's, special ones
  aside, with the decoded text; else `range(vocab_size)`), `output_len` ± `range_ratio` output tokens;
- "prompt-heavy": "random" with prompt lengths uniform over `PROMPT_HEAVY_INPUT_LENS`, whatever
  `input_len` says: prefill dominates and every batch mixes short and long prompts;
- "words": distinct prompts of `input_len` ± `range_ratio` words drawn from the tokenizer's
  whole-word entries, so no two share a prefix and a word is about a token; `output_len` each.
Arrivals, as in `vllm bench serve`: all at once at an infinite rate, else a Poisson process (the
first request at offset 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pdserve.bench.errors import BenchConfigError

DATASET_KINDS = ("random", "prompt-heavy", "words")
PROMPT_HEAVY_INPUT_LENS = (40, 550)  # tokens, both ends included
WORD_MIN_CHARS = 3


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request to send: a prompt's text or its ids or both (the same prompt; the client sends
    the ids, whose length is exact)."""

    prompt: str | None
    prompt_token_ids: list[int] | None
    output_len: int  # at least 1


def make_dataset(kind: str, *, num_prompts: int, seed: int, input_len: int = 1024, output_len: int = 128,
                 range_ratio: float = 0.0, tokenizer: Any = None, vocab_size: int | None = None) -> list[BenchRequest]:
    """`tokenizer` is a Hugging Face tokenizer (`len()`, `all_special_ids`, `decode`)."""
    if kind not in DATASET_KINDS:
        raise BenchConfigError(f"dataset kind {kind!r} is not one of {DATASET_KINDS}")
    if num_prompts < 1 or input_len < 1 or output_len < 1 or not 0.0 <= range_ratio < 1.0:
        raise BenchConfigError("num_prompts, input_len and output_len must be at least 1, range_ratio in [0, 1)")
    rng = np.random.default_rng(seed)
    if kind == "words":
        return _word_prompts(rng, tokenizer, input_len, output_len, range_ratio, num_prompts)
    if tokenizer is not None:
        special_ids = set(tokenizer.all_special_ids)
        token_pool = np.array([i for i in range(len(tokenizer)) if i not in special_ids])
    elif vocab_size:
        token_pool = np.arange(vocab_size)
    else:
        raise BenchConfigError("random prompts need a tokenizer or a vocab_size")
    if kind == "prompt-heavy":
        input_lens = rng.integers(PROMPT_HEAVY_INPUT_LENS[0], PROMPT_HEAVY_INPUT_LENS[1] + 1, size=num_prompts)
    else:
        input_lens = _uniform_lens(rng, input_len, range_ratio, num_prompts)
    output_lens = _uniform_lens(rng, output_len, range_ratio, num_prompts)
    prompts = [rng.choice(token_pool, size=num_tokens).tolist() for num_tokens in input_lens.tolist()]
    return [BenchRequest(prompt=tokenizer.decode(token_ids) if tokenizer is not None else None,
                         prompt_token_ids=token_ids, output_len=num_output)
            for token_ids, num_output in zip(prompts, output_lens.tolist())]


def _word_prompts(rng: np.random.Generator, tokenizer: Any, num_words: int, output_len: int, range_ratio: float,
                  num_prompts: int) -> list[BenchRequest]:
    if tokenizer is None:
        raise BenchConfigError("the words dataset needs a tokenizer")
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    decoded = (tokenizer.convert_tokens_to_string([piece]) for piece in pieces)
    words = np.array(sorted({text.strip() for text in decoded if text.startswith(" ") and text[1:].isalpha()
                             and text[1:].islower() and len(text) > WORD_MIN_CHARS}))  # [num_words] of str
    if not len(words):
        raise BenchConfigError("the tokenizer's vocabulary has no whole-word entries")
    requests = []
    for count in _uniform_lens(rng, num_words, range_ratio, num_prompts).tolist():
        text = " ".join(rng.choice(words, size=count)).capitalize() + "."
        token_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        requests.append(BenchRequest(prompt=text, prompt_token_ids=token_ids, output_len=output_len))
    return requests


def _uniform_lens(rng: np.random.Generator, length: int, range_ratio: float, num: int) -> np.ndarray:
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = max(low, math.ceil(length * (1 + range_ratio)))
    return rng.integers(low, high + 1, size=num)  # [num]


def arrival_offsets_s(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Send times from the start of the run: exponential gaps of mean 1 / rate."""
    if not request_rate > 0:
        raise BenchConfigError(f"request_rate must be positive (or inf), got {request_rate}")
    if math.isinf(request_rate) or num_requests == 0:
        return [0.0] * num_requests
    gaps_s = np.random.default_rng(seed).exponential(1.0 / request_rate, size=num_requests - 1)
    return [0.0] + np.cumsum(gaps_s).tolist()
