"""One disaggregated request's completion on the gateway: sampled tokens in, client chunks out.

The replica that sampled a token decides whether it ends the request by EOS, `stop_token_ids`
or `max_tokens`, and says so with a finish reason (prefill for the first token, decode for the
rest); this module trusts it, as vLLM's front trusts `EngineCoreOutputs`. It adds only what
needs the text: incremental detokenization (never half a UTF-8 character) and stop strings,
checked in the order `engine.stop` gives (EOS, then stop strings, then stop tokens, then length).

Invariant: the `text` deltas of the chunks concatenate to the final text. While a stop string
may still come, the last `len(longest stop) - 1` characters are held back, so a stop string
split over several tokens is never partly streamed and then cut.
"""
from __future__ import annotations

from dataclasses import dataclass

from pdserve.gateway.front.frontend_types import StreamChunk
from pdserve.protocol.detokenizer import IncrementalDetokenizer
from pdserve.protocol.outputs import TokenLogprobs
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.stop import find_stop_string, text_without_new


@dataclass(frozen=True, slots=True)
class SampledToken:
    """One token as a replica reports it."""

    token_id: int
    logprobs: TokenLogprobs | None  # when params.logprobs is set
    finish_reason: str | None = None  # "stop" | "length" when this token ends the request
    stop_token_id: int | None = None  # with "stop": the stop token that ended it; None for EOS


class CompletionText:
    def __init__(self, tokenizer, request_id: str, prompt_ids: list[int], params: SamplingParams):
        self.request_id = request_id
        self.params = params
        self.num_prompt_tokens = len(prompt_ids)
        self.token_ids: list[int] = []  # every token pushed so far, in order
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._num_streamed_chars = 0
        self._holdback_chars = 0
        if params.stop and not params.include_stop_str_in_output:
            self._holdback_chars = max(len(stop) for stop in params.stop) - 1

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def push(self, token: SampledToken) -> StreamChunk:
        """Accounts for the request's next token; call no more once `finished`."""
        self.token_ids.append(token.token_id)
        delta = self._detokenizer.push([token.token_id])
        self.text += delta
        self._decide_end(token, len(delta))
        stream_end = len(self.text) - (0 if self.finished else self._holdback_chars)
        new_text = self.text[self._num_streamed_chars:max(stream_end, self._num_streamed_chars)]
        self._num_streamed_chars += len(new_text)
        return StreamChunk(
            request_id=self.request_id, token_ids=[token.token_id], text=new_text,
            logprobs=[token.logprobs] if token.logprobs is not None else [],
            finish_reason=self.finish_reason, stop_reason=self.stop_reason,
            prompt_tokens=self.num_prompt_tokens, completion_tokens=self.num_output_tokens)

    def _decide_end(self, token: SampledToken, new_text_len: int) -> None:
        params = self.params
        eos = token.finish_reason == "stop" and token.stop_token_id is None
        stop_string = None if eos else find_stop_string(params, self.text, new_text_len)
        if stop_string is not None:
            self._end("stop", stop_string.stop_reason, stop_string.text)
        elif token.finish_reason == "stop":
            self._end("stop", token.stop_token_id, text_without_new(params, self.text, new_text_len))
        elif token.finish_reason is not None:
            self._end(token.finish_reason, None, self.text + self._detokenizer.finish())

    def _end(self, finish_reason: str, stop_reason: int | str | None, text: str) -> None:
        self.finish_reason, self.stop_reason, self.text = finish_reason, stop_reason, text
