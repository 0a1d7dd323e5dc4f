"""What every request goes through on arrival, whether the gateway or the engine sees it first.

Both check the same things with the same words, so a request the gateway accepts is one every
replica accepts, and a request sent straight to an engine is refused for the same reasons:
a prompt of at least one token, every id (prompt and logit_bias) in the vocabulary, and prompt plus `max_tokens` within
the context length. The seed is fixed here too, once, so every replica that samples for the
request (prefill's first token, decode's rest) samples with the same one.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.sampling_params import SamplingParams

SEED_BITS = 63  # seeds fit in an int64 as well as the proto's uint64


def validate_prompt(prompt_ids: Sequence[int], params: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    """Raises InvalidRequestError unless the prompt, its `max_tokens` and its biased ids fit the model."""
    if not prompt_ids:
        raise InvalidRequestError("prompt is empty")
    if any(not 0 <= token_id < vocab_size for token_id in prompt_ids):
        raise InvalidRequestError(f"prompt token ids must be in [0, {vocab_size})")
    if any(token_id >= vocab_size for token_id, _ in params.logit_bias):
        raise InvalidRequestError(f"logit_bias: token ids must be in [0, {vocab_size})")
    total = len(prompt_ids) + params.max_tokens
    if total > max_model_len:
        raise InvalidRequestError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
            f"exceeds the model's context length {max_model_len}")


def draw_seed(seed: int | None) -> int:
    """The request's effective seed: the client's, or a fresh random one."""
    return seed if seed is not None else random.getrandbits(SEED_BITS)
