"""Per-request sampling parameters, validated once when the request arrives.

Invariant: a `SamplingParams` that exists is valid. Every check lives in `__post_init__`, so the
sampler, the stop checker and the services never re-validate, and a bad field reaches the client
as an `InvalidRequestError` naming the field and the value. `stop` and `stop_token_ids` are
always tuples (a str or list is accepted and normalised), which keeps the value hashable.
"""
import math
from collections.abc import Iterable
from typing import NoReturn
from dataclasses import dataclass

from engine.errors import InvalidRequestError

MAX_LOGPROBS = 20
"""Largest number of top logprobs a request may ask for per generated token."""

GREEDY_TEMPERATURE_EPS = 1e-5
"""Temperatures below this are greedy: dividing logits by them would overflow float32."""


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _as_tuple("stop", self.stop, str))
        object.__setattr__(self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids, int))

        _require_int("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            _bad("max_tokens", self.max_tokens, "must be at least 1")
        _require_real("temperature", self.temperature)
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            _bad("temperature", self.temperature, "must be a finite number >= 0")
        if self.top_k is not None:
            _require_int("top_k", self.top_k)
            if self.top_k < 1:
                _bad("top_k", self.top_k, "must be >= 1, or None to disable")
        _require_real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            _bad("top_p", self.top_p, "must be in (0, 1]")
        _require_real("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            _bad("min_p", self.min_p, "must be in [0, 1]")
        if self.seed is not None:
            _require_int("seed", self.seed)
        for stop_str in self.stop:
            if not stop_str:
                _bad("stop", self.stop, "must not contain an empty string")
        for token_id in self.stop_token_ids:
            if token_id < 0:
                _bad("stop_token_ids", self.stop_token_ids, "must not contain negative ids")
        _require_bool("ignore_eos", self.ignore_eos)
        if self.logprobs is not None:
            _require_int("logprobs", self.logprobs)
            if not 0 <= self.logprobs <= MAX_LOGPROBS:
                _bad("logprobs", self.logprobs, f"must be in [0, {MAX_LOGPROBS}]")
        _require_bool("include_stop_str_in_output", self.include_stop_str_in_output)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS


def _bad(field: str, value: object, rule: str) -> NoReturn:
    raise InvalidRequestError(f"{field}={value!r}: {rule}")


def _require_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _bad(field, value, "must be an integer")


def _require_real(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _bad(field, value, "must be a number")


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
