"""Per-request sampling parameters, validated once when the request arrives.

Invariant: a `SamplingParams` that exists is valid. Every check lives in `__post_init__`, so the
sampler, the stop checker and the services never re-validate, and a bad field reaches the client
as an `InvalidRequestError` naming the field and the value. `stop` and `stop_token_ids` are
always tuples (a str or list is accepted and normalised), and `logit_bias` is a tuple of
(token id, bias) pairs sorted by id (a dict is accepted), which keeps the value hashable.
`top_k` of 0 or -1 (vLLM's spellings of "off") becomes None, on every front alike.
A `structured_output` (protocol/structured_output.py) is checked as data here and compiled where
the tokenizer is known.

Every value fits the field it travels in between processes (common.proto's `SamplingParams`):
integers within the wire widths below, floats finite in float32. So a request that passes here
never fails later in protobuf conversion, and both public fronts refuse the same requests.

The penalties, `min_tokens` and `logit_bias` mean what they mean in vLLM (see
`engine/logits_processors.py`); their defaults change nothing. A `logit_bias` token id is checked
against the vocabulary where the model is known, when the engine admits the request.
"""
from collections.abc import Iterable, Mapping
from typing import NoReturn
from dataclasses import dataclass

from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.structured_output import StructuredOutput

MAX_LOGPROBS = 20
"""Largest number of top logprobs a request may ask for per generated token."""

GREEDY_TEMPERATURE_EPS = 1e-5
"""Temperatures below this are greedy: dividing logits by them would overflow float32."""

MAX_ABS_PENALTY = 2.0
"""presence_penalty and frequency_penalty lie in [-MAX_ABS_PENALTY, MAX_ABS_PENALTY], as in OpenAI's API."""

MAX_ABS_LOGIT_BIAS = 100.0
"""logit_bias values lie in [-MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS], as in OpenAI's API."""

MAX_TOKEN_ID = 2**31 - 1
"""Token ids (logit_bias keys, stop_token_ids) and top_k stay within int32: logit_bias ids travel
as int32 on the wire, and every vocabulary is far smaller."""

MAX_UINT32 = 2**32 - 1
"""max_tokens travels as uint32."""

MAX_UINT64 = 2**64 - 1
"""seed travels as uint64."""

MAX_FLOAT32 = 3.4028234663852886e38
"""Floats travel as float32: anything larger in magnitude would arrive as inf."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_k: int | None = None  # None means off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # None: the engine draws one per request
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token; 0 = only the sampled one
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0  # subtracted once from each token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # divides seen tokens' positive logits, multiplies the others
    min_tokens: int = 0  # EOS and stop_token_ids cannot end the output before this many tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    structured_output: StructuredOutput | None = None  # what the output must match; None: free text

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _as_tuple("stop", self.stop, str))
        object.__setattr__(self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids, int))
        object.__setattr__(self, "logit_bias", _as_bias_pairs(self.logit_bias))

        _require_int("max_tokens", self.max_tokens)
        if not 1 <= self.max_tokens <= MAX_UINT32:
            _bad("max_tokens", self.max_tokens, f"must be in [1, {MAX_UINT32}]")
        _require_finite("temperature", self.temperature)
        if self.temperature < 0:
            _bad("temperature", self.temperature, "must be >= 0")
        if self.top_k is not None:
            _require_int("top_k", self.top_k)
            if self.top_k in (0, -1):
                object.__setattr__(self, "top_k", None)
            elif not 1 <= self.top_k <= MAX_TOKEN_ID:
                _bad("top_k", self.top_k, f"must be in [1, {MAX_TOKEN_ID}], or 0, -1 or None to disable")
        _require_finite("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            _bad("top_p", self.top_p, "must be in (0, 1]")
        _require_finite("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            _bad("min_p", self.min_p, "must be in [0, 1]")
        if self.seed is not None:
            _require_int("seed", self.seed)
            if not 0 <= self.seed <= MAX_UINT64:
                _bad("seed", self.seed, f"must be in [0, {MAX_UINT64}]")
        for stop_str in self.stop:
            if not stop_str:
                _bad("stop", self.stop, "must not contain an empty string")
        for token_id in self.stop_token_ids:
            if not 0 <= token_id <= MAX_TOKEN_ID:
                _bad("stop_token_ids", self.stop_token_ids, f"ids must be in [0, {MAX_TOKEN_ID}]")
        _require_bool("ignore_eos", self.ignore_eos)
        if self.logprobs is not None:
            _require_int("logprobs", self.logprobs)
            if not 0 <= self.logprobs <= MAX_LOGPROBS:
                _bad("logprobs", self.logprobs, f"must be in [0, {MAX_LOGPROBS}]")
        _require_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        for field in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, field)
            _require_finite(field, value)
            if not -MAX_ABS_PENALTY <= value <= MAX_ABS_PENALTY:
                _bad(field, value, f"must be in [{-MAX_ABS_PENALTY}, {MAX_ABS_PENALTY}]")
        _require_finite("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            _bad("repetition_penalty", self.repetition_penalty, "must be > 0")
        _require_int("min_tokens", self.min_tokens)
        if not 0 <= self.min_tokens <= self.max_tokens:
            _bad("min_tokens", self.min_tokens, f"must be in [0, max_tokens={self.max_tokens}]")
        if self.structured_output is not None:
            if not isinstance(self.structured_output, StructuredOutput):
                _bad("structured_output", self.structured_output, "must be a StructuredOutput")
            # A finished constraint allows only EOS: neither may take that away.
            if self.ignore_eos:
                _bad("ignore_eos", self.ignore_eos, "cannot be combined with a structured output")
            if self.min_tokens:
                _bad("min_tokens", self.min_tokens, "cannot be combined with a structured output")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def adjusts_logits(self) -> bool:
        """Whether the sampler changes this request's logits before temperature and the draw."""
        return self.uses_penalties or self.min_tokens > 0 or bool(self.logit_bias)


def _bad(field: str, value: object, rule: str) -> NoReturn:
    raise InvalidRequestError(f"{field}={value!r}: {rule}")


def _require_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _bad(field, value, "must be an integer")


def _require_finite(field: str, value: object) -> None:
    """A number that float32 holds without turning it into inf (nan is never one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _bad(field, value, "must be a number")
    if not abs(value) <= MAX_FLOAT32:  # also false for nan and inf, and exact for huge ints
        _bad(field, value, f"must be a finite number within +-{MAX_FLOAT32:.4g}")


def _require_bool(field: str, value: object) -> None:
    if not isinstance(value, bool):
        _bad(field, value, "must be a bool")


def _as_tuple(field: str, value: object, item_type: type) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        _bad(field, value, f"must be a sequence of {item_type.__name__}")
    items = tuple(value)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, item_type):
            _bad(field, value, f"must contain only {item_type.__name__} values")
    return items


def _as_bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    """A {token id: bias} mapping or (token id, bias) pairs -> checked pairs sorted by token id."""
    if value is None:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = [(token_id, bias) for token_id, bias in items]
    except (TypeError, ValueError):
        _bad("logit_bias", value, "must map token ids to biases")
    for token_id, bias in pairs:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id <= MAX_TOKEN_ID:
            _bad("logit_bias", value, f"token id {token_id!r} must be an integer in [0, {MAX_TOKEN_ID}]")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            _bad("logit_bias", value, f"bias of token {token_id} must be a number")
        if not -MAX_ABS_LOGIT_BIAS <= bias <= MAX_ABS_LOGIT_BIAS:
            _bad("logit_bias", value,
                 f"bias {bias!r} of token {token_id} must be in [{-MAX_ABS_LOGIT_BIAS}, {MAX_ABS_LOGIT_BIAS}]")
    token_ids = [token_id for token_id, _ in pairs]
    if len(set(token_ids)) != len(token_ids):
        _bad("logit_bias", value, "lists a token id twice")
    return tuple(sorted((token_id, float(bias)) for token_id, bias in pairs))
