"""Turns sampled tokens into client-facing outputs: text, stop decisions, stream deltas.

Invariant: the concatenation of a request's `new_text` deltas equals its final text. While a
request may still end on a stop string, the last `len(longest stop) - 1` characters are held
back from the stream, so a stop string that arrives split over several tokens is never
partly streamed and then cut.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionOutput, RequestOutput
from engine.request import Request
from engine.sampler import TokenLogprobs
from engine.stop import StopDecision, check_stop


@dataclass(slots=True)
class _RequestState:
    request: Request
    completion: CompletionOutput
    detokenizer: IncrementalDetokenizer
    holdback_chars: int
    num_streamed_chars: int = 0


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_id: int | None):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self._states: dict[str, _RequestState] = {}

    def add(self, request: Request) -> None:
        params = request.params
        completion = CompletionOutput(index=0, text="", token_ids=request.output_token_ids,
                                      logprobs=[] if params.logprobs is not None else None)
        holdback = 0
        if params.stop and not params.include_stop_str_in_output:
            holdback = max(len(stop) for stop in params.stop) - 1
        self._states[request.request_id] = _RequestState(
            request, completion, IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids), holdback)

    def remove(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def process(self, request_id: str, token_id: int,
                logprobs: TokenLogprobs | None) -> tuple[RequestOutput, StopDecision | None]:
        """Accounts for one sampled token (already appended to the request's output ids)."""
        state = self._states[request_id]
        request, completion = state.request, state.completion
        if completion.logprobs is not None:
            completion.logprobs.append(logprobs)
        delta = state.detokenizer.push([token_id])
        completion.text += delta
        decision = check_stop(request.params, request.output_token_ids, completion.text,
                              self.eos_token_id, len(delta))
        if decision is not None:
            completion.text = decision.text + (state.detokenizer.finish() if decision.finish_reason == "length" else "")
            completion.finish_reason = decision.finish_reason
            completion.stop_reason = decision.stop_reason
        stream_end = len(completion.text) - (0 if decision else state.holdback_chars)
        new_text = completion.text[state.num_streamed_chars:max(stream_end, state.num_streamed_chars)]
        state.num_streamed_chars += len(new_text)
        output = RequestOutput(
            request_id=request_id, prompt_token_ids=request.prompt_token_ids, outputs=[completion],
            finished=decision is not None, new_token_ids=[token_id], new_text=new_text,
            num_preemptions=request.num_preemptions)
        return output, decision
