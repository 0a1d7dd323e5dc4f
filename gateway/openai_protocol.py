"""OpenAI's completions and chat completions wire format, without the web server.

Two halves, both pure:
- parsing: a decoded JSON body becomes a `ParsedRequest` (a `GenerateInput` plus how to answer),
  or an `ApiError` that names the offending field. Fields this server cannot honour are rejected,
  never silently ignored, so a client cannot believe it got a behaviour it did not get.
- shaping: a shaper turns the frontend's `StreamChunk`s into the JSON objects OpenAI sends,
  one `chunk_events` call per chunk when streaming, one `response` call over all of them when not.

Both endpoints serve exactly one choice (n=1), so every choice has index 0. Logprobs follow
vLLM: values are clamped to -9999.0 (JSON has no -inf), token strings are single-token decodes,
and a completions `top_logprobs` entry also holds the sampled token.
"""
import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import InvalidRequestError, PdserveError
from engine.sampler import TokenLogprobs
from engine.sampling_params import SamplingParams
from gateway.frontend_types import GenerateInput, StreamChunk

MIN_LOGPROB = -9999.0

COMPLETION_DEFAULT_MAX_TOKENS = 16

_SAMPLING_FIELDS = (  # OpenAI / vLLM request field -> SamplingParams field, same meaning
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("seed", "seed"),
    ("stop", "stop"),
    ("stop_token_ids", "stop_token_ids"),
    ("ignore_eos", "ignore_eos"),
    ("include_stop_str_in_output", "include_stop_str_in_output"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("repetition_penalty", "repetition_penalty"),
    ("min_tokens", "min_tokens"),
    ("logit_bias", "logit_bias"),
)
_COMMON_FIELDS = frozenset(
    {"model", "n", "stream", "stream_options", "max_tokens", "user"}
    | {name for name, _ in _SAMPLING_FIELDS}
)
_COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "logprobs", "echo", "best_of", "suffix"}
_CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}


class ApiError(PdserveError):
    """A request the HTTP front answers with an error status and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class Endpoint(enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: Endpoint
    generate_input: GenerateInput
    stream: bool
    include_usage: bool  # stream only: finish with a usage event


def parse_completion_request(body: object, model_name: str) -> ParsedRequest:
    body = _common_checks(body, _COMPLETION_FIELDS, model_name)
    for name, allowed in (("best_of", 1), ("echo", False), ("suffix", None)):
        if body.get(name) not in (None, allowed):
            raise ApiError(400, f"{name}={body[name]!r} is not supported", param=name)
    if "prompt" not in body:
        raise ApiError(400, "prompt is required", param="prompt")
    prompt, prompt_token_ids = _parse_prompt(body["prompt"])
    max_tokens = body.get("max_tokens")
    params = _sampling_params(
        body,
        max_tokens=COMPLETION_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        logprobs=body.get("logprobs"),
        names={},
    )
    stream, include_usage = _parse_stream(body)
    return ParsedRequest(
        endpoint=Endpoint.COMPLETIONS,
        generate_input=GenerateInput(
            request_id=None,
            prompt=prompt,
            prompt_token_ids=prompt_token_ids,
            params=params,
            max_tokens_is_default=max_tokens is None,
        ),
        stream=stream,
        include_usage=include_usage,
    )


def parse_chat_request(body: object, model_name: str, max_model_len: int) -> ParsedRequest:
    """Without a max_tokens the answer may fill the context (`max_model_len`), as vLLM does."""
    body = _common_checks(body, _CHAT_FIELDS, model_name)
    messages = _parse_messages(body.get("messages"))
    max_tokens_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(max_tokens_name)
    want_logprobs = _optional(body, "logprobs", bool, "a bool")
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None and not want_logprobs:
        raise ApiError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    params = _sampling_params(
        body,
        max_tokens=max_model_len if max_tokens is None else max_tokens,
        logprobs=(0 if top_logprobs is None else top_logprobs) if want_logprobs else None,
        names={"max_tokens": max_tokens_name, "logprobs": "top_logprobs"},
    )
    stream, include_usage = _parse_stream(body)
    return ParsedRequest(
        endpoint=Endpoint.CHAT,
        generate_input=GenerateInput(
            request_id=None, messages=messages, params=params, max_tokens_is_default=max_tokens is None
        ),
        stream=stream,
        include_usage=include_usage,
    )


def _common_checks(body: object, known_fields: frozenset[str], model_name: str) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - known_fields)
    if unknown:
        raise ApiError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    model = _optional(body, "model", str, "a string")
    if model is not None and model != model_name:
        raise ApiError(
            404,
            f"The model `{model}` does not exist; this server serves `{model_name}`.",
            param="model",
            code="model_not_found",
        )
    n = _optional(body, "n", int, "an integer")
    if n not in (None, 1):
        raise ApiError(400, f"n={n!r}: only n=1 is supported", param="n")
    _optional(body, "user", str, "a string")
    return body


def _optional(body: dict, name: str, kind: type, description: str):
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise ApiError(400, f"{name}={value!r}: must be {description}", param=name)
    return value


def _parse_stream(body: dict) -> tuple[bool, bool]:
    stream = bool(_optional(body, "stream", bool, "a bool"))
    options = _optional(body, "stream_options", dict, "an object")
    if options is None:
        return stream, False
    if not stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", param="stream_options")
    unknown = sorted(set(options) - {"include_usage"})
    if unknown:
        raise ApiError(400, f"stream_options.{unknown[0]} is not supported", param="stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise ApiError(400, "stream_options.include_usage must be a bool", param="stream_options")
    return stream, bool(include_usage)


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_prompt(prompt: object) -> tuple[str | None, list[int] | None]:
    """One prompt: a string, a list of token ids, or a batch of exactly one of those."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt and all(_is_token_id(token) for token in prompt):
        return None, list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return _parse_prompt(prompt[0])
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, "batched prompts are not supported: send one prompt per request", param="prompt")
    raise ApiError(
        400, "prompt must be a string or a non-empty list of token ids (integers >= 0)", param="prompt"
    )


def _parse_messages(messages: object) -> list[dict]:
    """Normalises each message to {"role": str, "content": str}; text parts are joined by newlines."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    normalised = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise ApiError(400, f"{where} must be an object", param="messages")
        unknown = sorted(set(message) - {"role", "content"})
        if unknown:
            raise ApiError(400, f"{where}.{unknown[0]} is not supported", param="messages")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ApiError(400, f"{where}.role must be a non-empty string", param="messages")
        normalised.append({"role": role, "content": _message_text(message.get("content"), where)})
    return normalised


def _message_text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError(400, f"{where}.content: only text parts are supported", param="messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts", param="messages")


def _sampling_params(
    body: dict, *, max_tokens: object, logprobs: object, names: dict[str, str]
) -> SamplingParams:
    """Builds SamplingParams, whose own checks name the bad field; `names` maps its fields back
    to the request's names where they differ."""
    if body.get("stop") is not None and not isinstance(body["stop"], (str, list)):
        raise ApiError(400, f"stop={body['stop']!r}: must be a string or a list of strings", param="stop")
    kwargs = {field: body[name] for name, field in _SAMPLING_FIELDS if body.get(name) is not None}
    if kwargs.get("top_k") in (0, -1):  # vLLM's spellings of "top-k off"
        del kwargs["top_k"]
    if "logit_bias" in kwargs:
        kwargs["logit_bias"] = _parse_logit_bias(kwargs["logit_bias"])
    kwargs["max_tokens"] = max_tokens
    if logprobs is not None:
        kwargs["logprobs"] = logprobs
    try:
        return SamplingParams(**kwargs)
    except InvalidRequestError as exc:
        message = str(exc)
        field = message.split("=", 1)[0]
        if field not in {f.name for f in dataclasses.fields(SamplingParams)}:
            raise ApiError(400, message) from exc
        param = names.get(field, field)
        raise ApiError(400, param + message[len(field):], param=param) from exc


def _parse_logit_bias(logit_bias: object) -> dict[int, object]:
    """OpenAI's {"token id as a string": bias}; the biases are checked by SamplingParams."""
    if not isinstance(logit_bias, dict):
        raise ApiError(400, f"logit_bias={logit_bias!r}: must be an object", param="logit_bias")
    parsed = {}
    for key, bias in logit_bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ApiError(400, f"logit_bias: key {key!r} is not a token id", param="logit_bias")
        parsed[int(key)] = bias
    return parsed


def usage(chunk: StreamChunk) -> dict:
    return {
        "prompt_tokens": chunk.prompt_tokens,
        "completion_tokens": chunk.completion_tokens,
        "total_tokens": chunk.prompt_tokens + chunk.completion_tokens,
    }


def _clamped(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def _has_news(chunk: StreamChunk) -> bool:
    return bool(chunk.token_ids or chunk.text or chunk.finish_reason)


class _Shaper:
    """State shared by both shapers: identity of the response and how to name tokens."""

    object_name: str
    chunk_object_name: str
    id_prefix: str

    def __init__(self, parsed: ParsedRequest, model_name: str, created_s: int, token_text: Callable[[int], str]):
        self._with_logprobs = parsed.generate_input.params.logprobs is not None
        self._include_usage = parsed.include_usage
        self._model_name = model_name
        self._created_s = created_s
        self._token_text = token_text

    def _envelope(self, chunk: StreamChunk, choices: list[dict], *, streaming: bool) -> dict:
        envelope = {
            "id": self.id_prefix + chunk.request_id,
            "object": self.chunk_object_name if streaming else self.object_name,
            "created": self._created_s,
            "model": self._model_name,
            "choices": choices,
        }
        if not streaming:
            envelope["usage"] = usage(chunk)
        elif self._include_usage:
            envelope["usage"] = None
        return envelope

    def usage_event(self, last_chunk: StreamChunk) -> dict:
        """The event after the last chunk when the client asked for stream_options.include_usage."""
        return self._envelope(last_chunk, [], streaming=True) | {"usage": usage(last_chunk)}


class CompletionShaper(_Shaper):
    object_name = "text_completion"
    chunk_object_name = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, parsed: ParsedRequest, model_name: str, created_s: int, token_text: Callable[[int], str]):
        super().__init__(parsed, model_name, created_s, token_text)
        self._text_offset = 0  # characters of token text already reported

    def chunk_events(self, chunk: StreamChunk) -> list[dict]:
        if not _has_news(chunk):
            return []
        choice = self._choice(chunk.text, chunk.logprobs, chunk)
        return [self._envelope(chunk, [choice], streaming=True)]

    def response(self, chunks: list[StreamChunk]) -> dict:
        text = "".join(chunk.text for chunk in chunks)
        logprobs = [lp for chunk in chunks for lp in chunk.logprobs]
        return self._envelope(chunks[-1], [self._choice(text, logprobs, chunks[-1])], streaming=False)

    def _choice(self, text: str, logprobs: list[TokenLogprobs], last: StreamChunk) -> dict:
        return {
            "index": 0,
            "text": text,
            "logprobs": self._logprobs(logprobs) if self._with_logprobs else None,
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
        }

    def _logprobs(self, logprobs: list[TokenLogprobs]) -> dict:
        shaped = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for entry in logprobs:
            token = self._token_text(entry.token_id)
            top = {}
            for top_id, top_logprob in zip(entry.top_ids, entry.top_logprobs):
                top.setdefault(self._token_text(top_id), _clamped(top_logprob))
            top.setdefault(token, _clamped(entry.logprob))
            shaped["tokens"].append(token)
            shaped["token_logprobs"].append(_clamped(entry.logprob))
            shaped["top_logprobs"].append(top)
            shaped["text_offset"].append(self._text_offset)
            self._text_offset += len(token)
        return shaped


class ChatShaper(_Shaper):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, parsed: ParsedRequest, model_name: str, created_s: int, token_text: Callable[[int], str]):
        super().__init__(parsed, model_name, created_s, token_text)
        self._sent_role = False

    def chunk_events(self, chunk: StreamChunk) -> list[dict]:
        events = []
        if not self._sent_role:
            role = {"role": "assistant", "content": ""}
            opening = {"index": 0, "delta": role, "logprobs": None, "finish_reason": None}
            events.append(self._envelope(chunk, [opening], streaming=True))
            self._sent_role = True
        if _has_news(chunk):
            choice = {
                "index": 0,
                "delta": {"content": chunk.text} if chunk.text else {},
                "logprobs": self._logprobs(chunk.logprobs),
                "finish_reason": chunk.finish_reason,
                "stop_reason": chunk.stop_reason,
            }
            events.append(self._envelope(chunk, [choice], streaming=True))
        return events

    def response(self, chunks: list[StreamChunk]) -> dict:
        last = chunks[-1]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(chunk.text for chunk in chunks)},
            "logprobs": self._logprobs([lp for chunk in chunks for lp in chunk.logprobs]),
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
        }
        return self._envelope(last, [choice], streaming=False)

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
    parsed: ParsedRequest, model_name: str, created_s: int, token_text: Callable[[int], str]
) -> Shaper:
    """`token_text(token_id)` names one token in logprobs (a single-token decode)."""
    shaper_class = ChatShaper if parsed.endpoint is Endpoint.CHAT else CompletionShaper
    return shaper_class(parsed, model_name, created_s, token_text)
