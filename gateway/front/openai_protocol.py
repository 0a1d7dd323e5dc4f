"""OpenAI's request bodies, parsed without the web server (the answers' shapes are in
`openai_shaping`).

A decoded JSON body becomes a `ParsedRequest` (one `GenerateInput` per prompt plus how to
answer), or an `ApiError` that names the offending field. Fields this server cannot honour are
rejected, never silently ignored, so a client cannot believe it got a behaviour it did not get.

Refused combinations, where vLLM would need what this server does not compute: `echo` with
`logprobs` (the prompt's own logprobs), `best_of` other than `n` (ranking extra samples), and
`use_beam_search`.

Structured outputs come as OpenAI's `response_format`, vLLM's `structured_outputs` object or its
older `guided_json`, `guided_regex`, `guided_choice` and `guided_grammar`, on both endpoints; at
most one of them per request. Chat's `tools` (gateway.front.tool_requests) constrain the answer
too, to the tool calls they allow (gateway.front.tool_grammar), so they take no other constraint
unless tool_choice is "none". Chat messages are checked in gateway.front.chat_messages.

Both endpoints' grammars stay in this one file (under 400 lines): they share most field
rules, and a reader checking what a field means should find every use of it in one place.
"""
import dataclasses
import enum
from dataclasses import dataclass

from pdserve.gateway.front.api_error import ApiError
from pdserve.gateway.front.chat_messages import parse_messages
from pdserve.gateway.front.frontend_types import GenerateInput
from pdserve.gateway.front.tool_grammar import tool_grammar
from pdserve.gateway.front.tool_parsers import DEFAULT_TOOL_CALL_PARSER, TOOL_CALL_PARSERS, ToolCallParser
from pdserve.gateway.front.tool_prompt import ToolPrompt
from pdserve.gateway.front.tool_requests import TOOL_FIELDS, ToolRequest, parse_tool_request
from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.protocol.structured_output import StructuredOutput

COMPLETION_DEFAULT_MAX_TOKENS = 16

MAX_N = 128
"""Most choices one prompt may ask for: each is an engine request of its own."""

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
_GUIDED_FIELDS = (  # vLLM's guided_* field -> StructuredOutput field
    ("guided_json", "json"),
    ("guided_regex", "regex"),
    ("guided_choice", "choice"),
    ("guided_grammar", "grammar"),
)
_STRUCTURED_FIELDS = frozenset({"response_format", "structured_outputs"} | {name for name, _ in _GUIDED_FIELDS})
_COMMON_FIELDS = frozenset(
    {"model", "n", "stream", "stream_options", "max_tokens", "user", "use_beam_search"}
    | {name for name, _ in _SAMPLING_FIELDS} | _STRUCTURED_FIELDS
)
_COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "logprobs", "echo", "best_of", "suffix"}
_CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"} | TOOL_FIELDS
_TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages"})
_DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


class Endpoint(enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: Endpoint
    inputs: tuple[GenerateInput, ...]  # one per prompt (chat: exactly one); request_id unset
    n: int  # choices per prompt
    echo: bool  # completions: each choice's text starts with its prompt
    stream: bool
    include_usage: bool  # stream only: finish with a usage event
    tool_parser: ToolCallParser | None = None  # chat: reads tool calls out of the answers; None: it holds none

    @property
    def generate_input(self) -> GenerateInput:
        """The first prompt's input; every prompt shares its sampling parameters."""
        return self.inputs[0]


def parse_completion_request(body: object, model_name: str) -> ParsedRequest:
    body = _common_checks(body, _COMPLETION_FIELDS, model_name)
    n = _parse_n(body)
    best_of = _optional(body, "best_of", int, "an integer")
    if best_of is not None and best_of < n:
        raise ApiError(400, f"best_of={best_of} must be at least n={n}", param="best_of")
    if best_of is not None and best_of > n:
        raise ApiError(400, f"best_of={best_of} is not supported: only best_of=n (here {n})", param="best_of")
    if body.get("suffix") is not None:
        raise ApiError(400, f"suffix={body['suffix']!r} is not supported", param="suffix")
    echo = bool(_optional(body, "echo", bool, "a bool"))
    if echo and body.get("logprobs") is not None:
        raise ApiError(
            400, "echo with logprobs is not supported: it needs the prompt's logprobs, which are not computed",
            param="echo")
    if "prompt" not in body:
        raise ApiError(400, "prompt is required", param="prompt")
    prompts = _parse_prompts(body["prompt"])
    max_tokens = body.get("max_tokens")
    params = _sampling_params(
        body,
        max_tokens=COMPLETION_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        logprobs=body.get("logprobs"),
        names={},
        structured_output=_structured_output(body),
    )
    stream, include_usage = _parse_stream(body)
    inputs = tuple(
        GenerateInput(
            request_id=None,
            prompt=prompt,
            prompt_token_ids=prompt_token_ids,
            params=params,
            max_tokens_is_default=max_tokens is None,
        )
        for prompt, prompt_token_ids in prompts
    )
    return ParsedRequest(
        endpoint=Endpoint.COMPLETIONS, inputs=inputs, n=n, echo=echo, stream=stream, include_usage=include_usage
    )


def parse_chat_request(
    body: object, model_name: str, max_model_len: int,
    tool_parser: ToolCallParser = TOOL_CALL_PARSERS[DEFAULT_TOOL_CALL_PARSER],
) -> ParsedRequest:
    """Without a max_tokens the answer may fill the context (`max_model_len`), as vLLM does.
    `tool_parser` (--tool-call-parser) is the layout tool calls are constrained to and read in."""
    body = _common_checks(body, _CHAT_FIELDS, model_name)
    n = _parse_n(body)
    messages = parse_messages(body.get("messages"))
    tools = parse_tool_request(body)
    calls_allowed = tools is not None and tools.calls_allowed
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
        structured_output=_chat_constraint(body, tools, tool_parser),
    )
    stream, include_usage = _parse_stream(body)
    tool_prompt = None if tools is None else ToolPrompt(tools.specs, tool_parser if calls_allowed else None)
    generate_input = _chat_input(messages, tool_prompt=tool_prompt, params=params,
                                 max_tokens_is_default=max_tokens is None)
    return ParsedRequest(
        endpoint=Endpoint.CHAT, inputs=(generate_input,), n=n, echo=False, stream=stream, include_usage=include_usage,
        tool_parser=tool_parser if calls_allowed else None,
    )


def parse_tokenize_request(body: object, model_name: str) -> GenerateInput:
    """vLLM's /tokenize body: a text `prompt`, or chat `messages` rendered as generation would."""
    body = _common_checks(body, _TOKENIZE_FIELDS, model_name)
    if ("prompt" in body) == ("messages" in body):
        raise ApiError(400, "give exactly one of prompt or messages", param="prompt")
    if "messages" in body:
        return _chat_input(parse_messages(body["messages"]))
    if not isinstance(body["prompt"], str):
        raise ApiError(400, "prompt must be a string", param="prompt")
    return GenerateInput(request_id=None, prompt=body["prompt"])


def parse_detokenize_request(body: object, model_name: str) -> list[int]:
    """vLLM's /detokenize body: the `tokens` to turn back into text."""
    body = _common_checks(body, _DETOKENIZE_FIELDS, model_name)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(_is_token_id(token) for token in tokens):
        raise ApiError(400, "tokens must be a list of token ids (integers >= 0)", param="tokens")
    return tokens


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
    if body.get("use_beam_search") not in (None, False):
        raise ApiError(400, f"use_beam_search={body['use_beam_search']!r} is not supported", param="use_beam_search")
    _optional(body, "user", str, "a string")
    return body


def _parse_n(body: dict) -> int:
    n = _optional(body, "n", int, "an integer")
    if n is None:
        return 1
    if not 1 <= n <= MAX_N:
        raise ApiError(400, f"n={n}: must be in [1, {MAX_N}]", param="n")
    return n


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


def _parse_prompts(prompt: object) -> list[tuple[str | None, list[int] | None]]:
    """(text, token ids) per prompt, one of them set: `prompt` is a string, a list of token ids,
    or a non-empty batch of those."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [_parse_one_prompt(p, f"prompt[{index}]") for index, p in enumerate(prompt)]
    return [_parse_one_prompt(prompt, "prompt")]


def _parse_one_prompt(prompt: object, where: str) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt and all(_is_token_id(token) for token in prompt):
        return None, list(prompt)
    raise ApiError(
        400, f"{where} must be a string or a non-empty list of token ids (integers >= 0)", param="prompt"
    )


def _chat_input(messages: list[dict], **fields) -> GenerateInput:
    """GenerateInput checks each message's role and content, the same way for both fronts."""
    try:
        return GenerateInput(request_id=None, messages=messages, **fields)
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc), param="messages") from exc


def _sampling_params(
    body: dict, *, max_tokens: object, logprobs: object, names: dict[str, str],
    structured_output: StructuredOutput | None,
) -> SamplingParams:
    """Builds SamplingParams, whose own checks name the bad field; `names` maps its fields back
    to the request's names where they differ."""
    if body.get("stop") is not None and not isinstance(body["stop"], (str, list)):
        raise ApiError(400, f"stop={body['stop']!r}: must be a string or a list of strings", param="stop")
    kwargs = {field: body[name] for name, field in _SAMPLING_FIELDS if body.get(name) is not None}
    if "logit_bias" in kwargs:
        kwargs["logit_bias"] = _parse_logit_bias(kwargs["logit_bias"])
    kwargs["max_tokens"] = max_tokens
    if logprobs is not None:
        kwargs["logprobs"] = logprobs
    kwargs["structured_output"] = structured_output
    try:
        return SamplingParams(**kwargs)
    except InvalidRequestError as exc:
        message = str(exc)
        field = message.split("=", 1)[0]
        if field not in {f.name for f in dataclasses.fields(SamplingParams)}:
            raise ApiError(400, message) from exc
        param = names.get(field, field)
        raise ApiError(400, param + message[len(field):], param=param) from exc


def _chat_constraint(body: dict, tools: ToolRequest | None, tool_parser: ToolCallParser) -> StructuredOutput | None:
    """The tool calls' grammar when tools allow calls, else the request's own structured output."""
    structured = _structured_output(body)
    if tools is None or not tools.calls_allowed:
        return structured
    if structured is not None:
        field = next(name for name in sorted(_STRUCTURED_FIELDS) if body.get(name) is not None)
        raise ApiError(400, f"{field} cannot be combined with tools unless tool_choice is \"none\" "
                            f"(here {tools.choice.value})", param=field)
    return StructuredOutput(grammar=tool_grammar(tools, tool_parser))


def _structured_output(body: dict) -> StructuredOutput | None:
    """The one constraint among response_format, structured_outputs and guided_*, or None."""
    given = sorted(name for name in _STRUCTURED_FIELDS if body.get(name) is not None)
    if len(given) > 1:
        raise ApiError(400, f"give at most one of {', '.join(given)}", param=given[1])
    if not given:
        return None
    name, value = given[0], body[given[0]]
    try:
        if name == "response_format":
            return _response_format(value)
        if name == "structured_outputs":
            if not isinstance(value, dict):
                raise ApiError(400, "structured_outputs must be an object", param=name)
            unknown = sorted(set(value) - {"json", "json_object", "regex", "choice", "grammar"})
            if unknown:
                raise ApiError(400, f"structured_outputs.{unknown[0]} is not supported", param=name)
            return StructuredOutput(**{key: item for key, item in value.items() if item is not None})
        return StructuredOutput(**{dict(_GUIDED_FIELDS)[name]: value})
    except InvalidRequestError as exc:
        raise ApiError(400, f"{name}: {exc}", param=name) from exc


def _response_format(value: object) -> StructuredOutput | None:
    """OpenAI's response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind != "json_schema":
        raise ApiError(400, f"response_format={value!r}: type must be text, json_object or json_schema",
                       param="response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ApiError(400, "response_format.json_schema must be an object with a name", param="response_format")
    schema = spec.get("schema")
    return StructuredOutput(json_object=True) if schema is None else StructuredOutput(json=schema)


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
