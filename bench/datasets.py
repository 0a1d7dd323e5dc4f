"""Benchmark datasets: lists of `BenchRequest`, identical for identical arguments.

Kinds, as in `vllm bench serve`:
- "random": random token ids, `prefix_len` shared ids then `input_len` ± `range_ratio` own ids
  per prompt, output lengths `output_len` ± `range_ratio`. Ids come from the tokenizer's vocabulary
  minus its special tokens (or from `range(vocab_size)` when no tokenizer is given); with a
  tokenizer each request also carries the decoded text.
- "prompt-heavy": "random" with prompt lengths drawn uniformly from
  `PROMPT_HEAVY_INPUT_LENS` (40..550 tokens, mean ~295) whatever `input_len` and `range_ratio`
  say: prefill dominates the work, and every batch mixes short and long prompts.
- "words": distinct prose-like prompts of `input_len` ± `range_ratio` words each (not tokens),
  every word drawn at random from the tokenizer's whole-word vocabulary entries (`WORD_MIN_CHARS`+
  letters after a leading space), so no two prompts share a prefix and each tokenizes to about
  one token a word; every request asks for exactly `output_len` tokens. Needs a tokenizer; the
  request carries the text and its token ids.
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
    """One request to send. At least one prompt form; when both are given they are the same
    prompt (the text is the decoding of the ids) and the client sends the ids, whose length is exact."""

    prompt: str | None
    prompt_token_ids: list[int] | None
    output_len: int

    def __post_init__(self) -> None:
        if self.prompt is None and self.prompt_token_ids is None:
            raise BenchConfigError("a BenchRequest needs a prompt or prompt_token_ids")
        if self.prompt_token_ids is not None and not self.prompt_token_ids:
            raise BenchConfigError("prompt_token_ids must not be empty")
        if self.output_len < 1:
            raise BenchConfigError(f"output_len must be at least 1, got {self.output_len}")


def make_dataset(kind: str, *, num_prompts: int, seed: int, input_len: int = 1024,
                 output_len: int = 128, range_ratio: float = 0.0, prefix_len: int = 0,
                 tokenizer: Any = None, vocab_size: int | None = None) -> list[BenchRequest]:
    """`tokenizer` is a Hugging Face tokenizer (`len()`, `all_special_ids`, `decode`)."""
    if num_prompts < 1:
        raise BenchConfigError(f"num_prompts must be at least 1, got {num_prompts}")
    if kind not in DATASET_KINDS:
        raise BenchConfigError(f"dataset kind {kind!r} is not one of {DATASET_KINDS}")
    if not 0.0 <= range_ratio < 1.0:
        raise BenchConfigError(f"range_ratio must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1 or prefix_len < 0:
        raise BenchConfigError("input_len and output_len must be at least 1, prefix_len at least 0")
    rng = np.random.default_rng(seed)
    if kind == "words":
        return _word_prompts(rng, tokenizer, input_len, output_len, range_ratio, num_prompts)
    token_pool = _token_pool(tokenizer, vocab_size)
    if kind == "prompt-heavy":
        input_lens = rng.integers(PROMPT_HEAVY_INPUT_LENS[0], PROMPT_HEAVY_INPUT_LENS[1] + 1, size=num_prompts)
    else:
        input_lens = _uniform_lens(rng, input_len, range_ratio, num_prompts)
    output_lens = _uniform_lens(rng, output_len, range_ratio, num_prompts)
    prefix_ids = rng.choice(token_pool, size=prefix_len).tolist()
    prompts = [prefix_ids + rng.choice(token_pool, size=own_len).tolist() for own_len in input_lens.tolist()]
    return [BenchRequest(prompt=tokenizer.decode(token_ids) if tokenizer is not None else None,
                         prompt_token_ids=token_ids, output_len=out_len)
            for token_ids, out_len in zip(prompts, output_lens.tolist())]


def _word_prompts(rng: np.random.Generator, tokenizer: Any, num_words: int, output_len: int, range_ratio: float,
                  num_prompts: int) -> list[BenchRequest]:
    if tokenizer is None:
        raise BenchConfigError("the words dataset needs a tokenizer")
    words = _word_pool(tokenizer)
    requests = []
    for count in _uniform_lens(rng, num_words, range_ratio, num_prompts).tolist():
        text = " ".join(rng.choice(words, size=count)).capitalize() + "."
        token_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        requests.append(BenchRequest(prompt=text, prompt_token_ids=token_ids, output_len=output_len))
    return requests


def _word_pool(tokenizer: Any) -> np.ndarray:  # [num_words] of str
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    decoded = (tokenizer.convert_tokens_to_string([piece]) for piece in pieces)
    words = sorted({text.strip() for text in decoded
                    if text.startswith(" ") and text[1:].isalpha() and text[1:].islower()
                    and len(text) > WORD_MIN_CHARS})
    if not words:
        raise BenchConfigError("the tokenizer's vocabulary has no whole-word entries")
    return np.array(words)


def _token_pool(tokenizer: Any, vocab_size: int | None) -> np.ndarray:  # [num_allowed_ids]
    if tokenizer is not None:
        special_ids = set(tokenizer.all_special_ids)
        return np.array([i for i in range(len(tokenizer)) if i not in special_ids])
    if vocab_size is None or vocab_size < 1:
        raise BenchConfigError("random prompts need a tokenizer or a vocab_size")
    return np.arange(vocab_size)


def _uniform_lens(rng: np.random.Generator, length: int, range_ratio: float, num: int) -> np.ndarray:
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = max(low, math.ceil(length * (1 + range_ratio)))
    return rng.integers(low, high + 1, size=num)  # [num]
