"""Turns sampled tokens into client-facing outputs: text, stop decisions, stream deltas.

Invariant: the concatenation of a request's `new_text` deltas equals its final text. While a
request may still end on a stop string, the last `len(longest stop) - 1` characters are held
back from the stream, so a stop string that arrives split over several tokens is never
partly streamed and then cut.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdserve.engine.request import Request
from pdserve.protocol.detokenizer import IncrementalDetokenizer
from pdserve.protocol.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from pdserve.protocol.stop import StopDecision, check_stop

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


@dataclass(slots=True)
class _RequestState:
    request: Request
    completion: CompletionOutput
    detokenizer: IncrementalDetokenizer | None  # None when the engine does not detokenize
    holdback_chars: int
    num_streamed_chars: int = 0


class OutputProcessor:
    """Without a tokenizer (a replica whose gateway turns tokens into text) no text is produced
    and stop strings are left to the caller; token-based stops still apply."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast | None, eos_token_id: int | None):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.detokenize = tokenizer is not None
        self._states: dict[str, _RequestState] = {}

    def add(self, request: Request) -> None:
        params = request.params
        completion = CompletionOutput(index=0, text="", token_ids=request.output_token_ids,
                                      logprobs=[] if params.logprobs is not None else None)
        holdback = 0
        if self.detokenize and params.stop and not params.include_stop_str_in_output:
            holdback = max(len(stop) for stop in params.stop) - 1
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids) if self.detokenize else None
        self._states[request.request_id] = _RequestState(request, completion, detokenizer, holdback)

    def skip_sampled_tokens(self, request_id: str) -> None:
        """Accounts for the output tokens the request arrived with, sampled and streamed elsewhere
        (the first token by prefill; after a migration, also those of an earlier decode replica)."""
        state = self._states[request_id]
        if state.detokenizer is not None:
            state.completion.text = state.detokenizer.push(state.request.output_token_ids)
            state.num_streamed_chars = len(state.completion.text)

    def remove(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def process(self, request_id: str, token_id: int,
                logprobs: TokenLogprobs | None) -> tuple[RequestOutput, StopDecision | None]:
        """Accounts for one sampled token (already appended to the request's output ids)."""
        state = self._states[request_id]
        request, completion = state.request, state.completion
        if completion.logprobs is not None:
            completion.logprobs.append(logprobs)
        delta = state.detokenizer.push([token_id]) if state.detokenizer else ""
        completion.text += delta
        decision = check_stop(request.params, request.output_token_ids, completion.text,
                              self.eos_token_id, len(delta))
        if decision is not None:
            completion.text = decision.text
            if decision.finish_reason == "length" and state.detokenizer:
                completion.text += state.detokenizer.finish()
            completion.finish_reason = decision.finish_reason
            completion.stop_reason = decision.stop_reason
        stream_end = len(completion.text) - (0 if decision else state.holdback_chars)
        new_text = completion.text[state.num_streamed_chars:max(stream_end, state.num_streamed_chars)]
        state.num_streamed_chars += len(new_text)
        output = RequestOutput(
            request_id=request_id, prompt_token_ids=request.prompt_token_ids, outputs=[completion],
            finished=decision is not None, new_token_ids=[token_id],
            new_logprobs=[logprobs] if logprobs is not None else [], new_text=new_text,
            num_output_tokens=len(request.output_token_ids), num_preemptions=request.num_preemptions)
        return output, decision
