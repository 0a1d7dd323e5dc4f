"""OpenAI's completions and chat completions answers, built from the frontend's `StreamChunk`s.

A shaper serves one request with `len(prompts) * n` choices, numbered as `fan_out` numbers them.
When streaming, `chunk_events(index, chunk)` turns each chunk of choice `index` into the events
OpenAI sends (a chat choice opens with its role) and `usage_event()` makes the optional last
one; when not, `response` builds the whole answer from every choice's chunks. Usage counts each
prompt's tokens once, however many choices it has, and every choice's generated tokens.

A chat request whose tools allow calls (`ParsedRequest.tool_parser`) has each choice's text split
into content and tool calls (gateway.front.tool_calls): a message gets `tool_calls` (and content
null when it holds only calls), a stream holds back the calls' text and sends each call whole as
a `tool_calls` delta, and an answer that ended by itself after calls finishes with "tool_calls".

With `echo`, a completion choice's text starts with its prompt's text (in the first event when
streaming), as vLLM does. Logprobs follow vLLM: values are clamped to -9999.0 (JSON has no
-inf), token strings are single-token decodes, and a completions `top_logprobs` entry also holds
the sampled token.
"""
from collections.abc import Callable

from pdserve.gateway.front.frontend_types import StreamChunk
from pdserve.gateway.front.openai_protocol import Endpoint, ParsedRequest
from pdserve.gateway.front.tool_calls import ToolCallSplitter, split_answer, tool_finish_reason
from pdserve.protocol.outputs import TokenLogprobs

MIN_LOGPROB = -9999.0


def usage(last_chunks: list[StreamChunk], n: int) -> dict:
    """`last_chunks`: each choice's latest chunk, in choice order; `n` choices per prompt."""
    prompt_tokens = sum(chunk.prompt_tokens for chunk in last_chunks[::n])
    completion_tokens = sum(chunk.completion_tokens for chunk in last_chunks)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _clamped(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def _has_news(chunk: StreamChunk) -> bool:
    return bool(chunk.token_ids or chunk.text or chunk.finish_reason)


class _Shaper:
    """State shared by both shapers: identity of the response, how to name tokens, usage."""

    object_name: str
    chunk_object_name: str
    id_prefix: str

    def __init__(
        self, parsed: ParsedRequest, request_id: str, model_name: str, created_s: int,
        decode: Callable[[list[int]], str],
    ):
        self._parsed = parsed
        self._with_logprobs = parsed.generate_input.params.logprobs is not None
        self._id = self.id_prefix + request_id
        self._model_name = model_name
        self._created_s = created_s
        self._decode = decode
        self._last_chunks: dict[int, StreamChunk] = {}  # choice index -> its latest streamed chunk

    def _token_text(self, token_id: int) -> str:
        return self._decode([token_id])

    def _envelope(self, choices: list[dict], *, streaming: bool, usage: dict | None = None) -> dict:
        envelope = {
            "id": self._id,
            "object": self.chunk_object_name if streaming else self.object_name,
            "created": self._created_s,
            "model": self._model_name,
            "choices": choices,
        }
        if not streaming or self._parsed.include_usage:
            envelope["usage"] = usage
        return envelope

    def chunk_events(self, index: int, chunk: StreamChunk) -> list[dict]:
        self._last_chunks[index] = chunk
        return self._choice_events(index, chunk)

    def usage_event(self) -> dict:
        """The event after every choice's last chunk when the client asked for include_usage."""
        last_chunks = [self._last_chunks[index] for index in sorted(self._last_chunks)]
        return self._envelope([], streaming=True, usage=usage(last_chunks, self._parsed.n))

    def response(self, chunks_by_choice: list[list[StreamChunk]]) -> dict:
        """The whole answer; `chunks_by_choice[i]` holds choice i's chunks, the last one finished."""
        choices = [self._whole_choice(index, chunks) for index, chunks in enumerate(chunks_by_choice)]
        last_chunks = [chunks[-1] for chunks in chunks_by_choice]
        return self._envelope(choices, streaming=False, usage=usage(last_chunks, self._parsed.n))

    def _choice_events(self, index: int, chunk: StreamChunk) -> list[dict]:
        raise NotImplementedError

    def _whole_choice(self, index: int, chunks: list[StreamChunk]) -> dict:
        raise NotImplementedError


class CompletionShaper(_Shaper):
    object_name = "text_completion"
    chunk_object_name = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._text_offsets: dict[int, int] = {}  # choice index -> characters of token text reported
        self._echoed: set[int] = set()

    def _choice_events(self, index: int, chunk: StreamChunk) -> list[dict]:
        if not _has_news(chunk):
            return []
        text = chunk.text
        if self._parsed.echo and index not in self._echoed:
            self._echoed.add(index)
            text = self._prompt_text(index) + text
        return [self._envelope([self._choice(index, text, chunk.logprobs, chunk)], streaming=True)]

    def _whole_choice(self, index: int, chunks: list[StreamChunk]) -> dict:
        text = "".join(chunk.text for chunk in chunks)
        if self._parsed.echo:
            text = self._prompt_text(index) + text
        logprobs = [lp for chunk in chunks for lp in chunk.logprobs]
        return self._choice(index, text, logprobs, chunks[-1])

    def _prompt_text(self, index: int) -> str:
        prompt = self._parsed.inputs[index // self._parsed.n]
        return prompt.prompt if prompt.prompt is not None else self._decode(prompt.prompt_token_ids)

    def _choice(self, index: int, text: str, logprobs: list[TokenLogprobs], last: StreamChunk) -> dict:
        return {
            "index": index,
            "text": text,
            "logprobs": self._logprobs(index, logprobs) if self._with_logprobs else None,
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
        }

    def _logprobs(self, index: int, logprobs: list[TokenLogprobs]) -> dict:
        shaped = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        text_offset = self._text_offsets.get(index, 0)
        for entry in logprobs:
            token = self._token_text(entry.token_id)
            top = {}
            for top_id, top_logprob in zip(entry.top_ids, entry.top_logprobs):
                top.setdefault(self._token_text(top_id), _clamped(top_logprob))
            top.setdefault(token, _clamped(entry.logprob))
            shaped["tokens"].append(token)
            shaped["token_logprobs"].append(_clamped(entry.logprob))
            shaped["top_logprobs"].append(top)
            shaped["text_offset"].append(text_offset)
            text_offset += len(token)
        self._text_offsets[index] = text_offset
        return shaped


class ChatShaper(_Shaper):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._opened: set[int] = set()  # choices whose role event was sent
        self._splitters: dict[int, ToolCallSplitter] = {}  # with tool calls: each choice's

    def _choice_events(self, index: int, chunk: StreamChunk) -> list[dict]:
        events = []
        if index not in self._opened:
            role = {"role": "assistant", "content": ""}
            opening = {"index": index, "delta": role, "logprobs": None, "finish_reason": None}
            events.append(self._envelope([opening], streaming=True))
            self._opened.add(index)
        if not _has_news(chunk):
            return events
        delta, finish_reason = self._delta(index, chunk)
        logprobs = self._logprobs(chunk.logprobs)
        if "tool_calls" in delta and finish_reason is not None:
            # The openai client's stream helper closes a call when the next one starts or the choice
            # finishes, the finish first: the last calls go in an event before the finishing one.
            events.append(self._streamed_choice(index, delta, logprobs, None, None))
            delta, logprobs = {}, self._logprobs([])
        events.append(self._streamed_choice(index, delta, logprobs, finish_reason, chunk.stop_reason))
        return events

    def _streamed_choice(self, index: int, delta: dict, logprobs: dict | None, finish_reason: str | None,
                         stop_reason: int | str | None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
        return self._envelope([choice], streaming=True)

    def _delta(self, index: int, chunk: StreamChunk) -> tuple[dict, str | None]:
        """The chunk's delta and finish reason."""
        parser = self._parsed.tool_parser
        if parser is None:
            return ({"content": chunk.text} if chunk.text else {}), chunk.finish_reason
        splitter = self._splitters.setdefault(index, ToolCallSplitter(parser))
        content, calls = splitter.feed(chunk.text)
        if chunk.finish_reason is not None:
            last_content, last_calls = splitter.finish()
            content, calls = content + last_content, calls + last_calls
        delta = {"content": content} if content else {}
        if calls:
            delta["tool_calls"] = [call.as_delta() for call in calls]
        return delta, tool_finish_reason(chunk.finish_reason, splitter.num_calls)

    def _whole_choice(self, index: int, chunks: list[StreamChunk]) -> dict:
        last = chunks[-1]
        text = "".join(chunk.text for chunk in chunks)
        message = {"role": "assistant", "content": text}
        finish_reason = last.finish_reason
        if self._parsed.tool_parser is not None:
            content, calls = split_answer(self._parsed.tool_parser, text)
            message = {"role": "assistant", "content": content or (None if calls else ""),
                       "tool_calls": [call.as_json() for call in calls]}
            finish_reason = tool_finish_reason(last.finish_reason, len(calls))
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs([lp for chunk in chunks for lp in chunk.logprobs]),
            "finish_reason": finish_reason,
            "stop_reason": last.stop_reason,
        }

    def _logprobs(self, logprobs: list[TokenLogprobs]) -> dict | None:
        if not self._with_logprobs:
            return None
        return {
            "content": [
                self._token_entry(entry.token_id, entry.logprob)
                | {"top_logprobs": [self._token_entry(i, lp) for i, lp in zip(entry.top_ids, entry.top_logprobs)]}
                for entry in logprobs
            ]
        }

    def _token_entry(self, token_id: int, logprob: float) -> dict:
        token = self._token_text(token_id)
        return {"token": token, "logprob": _clamped(logprob), "bytes": list(token.encode("utf-8"))}


Shaper = CompletionShaper | ChatShaper


def create_shaper(
    parsed: ParsedRequest, request_id: str, model_name: str, created_s: int, decode: Callable[[list[int]], str]
) -> Shaper:
    """`request_id` names the response ("cmpl-<id>"); `decode(token_ids)` turns tokens into text
    (a single-token decode names one token in logprobs)."""
    shaper_class = ChatShaper if parsed.endpoint is Endpoint.CHAT else CompletionShaper
    return shaper_class(parsed, request_id, model_name, created_s, decode)
