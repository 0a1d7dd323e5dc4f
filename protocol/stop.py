"""When a request stops generating, and what its output text is then.

Checked after every generated token, in vLLM's order; the first rule that fires decides:

1. the EOS token (unless `ignore_eos`)          -> "stop", stop_reason None
2. a stop string ending in the newest text      -> "stop", stop_reason the string
3. a token in `stop_token_ids`                  -> "stop", stop_reason the token id
4. `max_tokens` output tokens                   -> "length", stop_reason None

so a stop on the same token as the length limit wins. Before `min_tokens` output tokens exist
only rule 4 applies (the sampler keeps EOS and the stop tokens from being drawn then), and, as
in vLLM, stop strings are searched only once the output is longer than `min_tokens`. The
returned text is the output text as
the client should see it: for 1 and 3 without the stopping token's text, for 2 cut just before
the stop string; `include_stop_str_in_output` keeps either.

A stop string can only newly appear where it overlaps the newest text, so only the last
`new_text_len + len(stop) - 1` characters are searched. If several stop strings end in the new
text, the one that starts first wins (the earlier one in `params.stop` on a tie), since the
client must never see text past a stop string. Text the detokenizer holds back (an incomplete
character) reaches this check in a later delta, and a stop string in it is found then.
"""
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pdserve.protocol.sampling_params import SamplingParams

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class StopDecision:
    finish_reason: FinishReason
    stop_reason: int | str | None  # the stop token id or stop string; None for EOS and length
    text: str  # the final output text


def check_stop(
    params: SamplingParams,
    output_token_ids: Sequence[int],
    text: str,
    eos_token_id: int | None,
    new_text_len: int,
) -> StopDecision | None:
    """Decide whether the request stops after its newest token; None means keep going.

    text is the whole output text so far; its last new_text_len characters arrived with the
    newest token(s).
    """
    if not output_token_ids:
        return None
    if len(output_token_ids) < params.min_tokens:
        return None  # and min_tokens <= max_tokens, so the length limit is not reached either
    last_token_id = output_token_ids[-1]
    if not params.ignore_eos and eos_token_id is not None and last_token_id == eos_token_id:
        return StopDecision("stop", None, text_without_new(params, text, new_text_len))
    if len(output_token_ids) > params.min_tokens:
        stop_string = find_stop_string(params, text, new_text_len)
        if stop_string is not None:
            return stop_string
    if last_token_id in params.stop_token_ids:
        return StopDecision("stop", last_token_id, text_without_new(params, text, new_text_len))
    if len(output_token_ids) >= params.max_tokens:
        return StopDecision("length", None, text)
    return None


def text_without_new(params: SamplingParams, text: str, new_text_len: int) -> str:
    """The output text without the stopping token's, unless `include_stop_str_in_output`."""
    if params.include_stop_str_in_output or new_text_len == 0:
        return text
    return text[:-new_text_len]


def find_stop_string(params: SamplingParams, text: str, new_text_len: int) -> StopDecision | None:
    """Rule 2 alone, for a caller that has the text but trusts another's token-based decision."""
    if new_text_len == 0 or not params.stop:
        return None
    best_index, best_stop = len(text), None
    for stop in params.stop:
        search_from = max(len(text) - new_text_len - len(stop) + 1, 0)
        index = text.find(stop, search_from, best_index + len(stop) - 1)
        if index != -1 and index < best_index:
            best_index, best_stop = index, stop
    if best_stop is None:
        return None
    end = best_index + len(best_stop) if params.include_stop_str_in_output else best_index
    return StopDecision("stop", best_stop, text[:end])
