"""RoPE as a config.json asks for it, read to one `RopeConfig` (engine/rope.py computes it).

Older folders spell RoPE as `rope_theta` + `rope_scaling`, newer ones as `rope_parameters`;
both read the same. What a family spells its own way is its `RopeRules` (engine/families.py).
No torch here: the gateway reads configs too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pdserve.protocol.errors import InvalidModelError


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"  # "default" | "linear" | "llama3" | "longrope"
    factor: float = 1.0  # linear: every frequency divided by it; llama3: the long wavelengths
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors within the original context
    long_factor: tuple[float, ...] = ()  # longrope: beyond it
    attention_factor: float = 1.0  # cos and sin are scaled by it (longrope)
    partial_rotary_factor: float = 1.0  # the share of head_dim that rotates; the rest passes through


@dataclass(frozen=True, slots=True)
class RopeRules:
    """A family's own spelling of rope in config.json; the defaults are the shared one."""
    type_aliases: tuple[tuple[str, str], ...] = ()  # (old name, rope type)
    # LongRoPE's original context: the top-level original_max_position_embeddings wins over the rope
    # parameters' wherever it is given; where this is set, it is that key's default too.
    original_context: int | None = None
    local_theta_key: str | None = None  # an older folder's key for the sliding layers' own rope base


def read_ropes(raw: dict, head_dim: int, rules: RopeRules = RopeRules()) -> tuple[RopeConfig, RopeConfig | None]:
    """The rope of full-attention layers, and that of sliding-window layers where it differs:
    `rope_parameters` nested by layer type, or (older folders) the sliding layers' base under
    `rules.local_theta_key`, `rope_scaling` then scaling the full-attention layers alone."""
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params:
        local = params.get("sliding_attention")
        return _read_rope(raw, dict(params["full_attention"]), head_dim, rules), (
            None if local is None else _read_rope(raw, dict(local), head_dim, rules))
    rope = _read_rope(raw, dict(params or raw.get("rope_scaling") or {}), head_dim, rules)
    local_theta = raw.get(rules.local_theta_key) if rules.local_theta_key else None
    return rope, None if local_theta is None else RopeConfig(theta=local_theta)


def _read_rope(raw: dict, params: dict, head_dim: int, rules: RopeRules) -> RopeConfig:
    theta = params.pop("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    rope_type = dict(rules.type_aliases).get(rope_type, rope_type)
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if rope_type in ("default", "linear"):
        return RopeConfig(theta=theta, rope_type=rope_type, factor=params.get("factor", 1.0),
                          partial_rotary_factor=partial)
    if rope_type == "llama3":
        return RopeConfig(
            theta=theta,
            rope_type=rope_type,
            factor=params["factor"],
            low_freq_factor=params["low_freq_factor"],
            high_freq_factor=params["high_freq_factor"],
            original_max_position_embeddings=params["original_max_position_embeddings"],
            partial_rotary_factor=partial,
        )
    if rope_type == "longrope":
        return _read_longrope(raw, params, theta, partial, head_dim, rules)
    raise InvalidModelError(f"unsupported rope type {rope_type!r}; supported: default, linear, llama3, longrope")


def _read_longrope(raw: dict, params: dict, theta: float, partial: float, head_dim: int,
                   rules: RopeRules) -> RopeConfig:
    """LongRoPE, read as transformers reads it: a top-level `original_max_position_embeddings`
    wins (see `RopeRules.original_context`); `factor` defaults to the ratio of the context
    lengths, and the attention factor to sqrt(1 + ln(factor) / ln(original length))."""
    key = "original_max_position_embeddings"
    original = raw.get(key, rules.original_context) or params[key]
    factor = params.get("factor") or raw["max_position_embeddings"] / original
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
    short, long = tuple(params["short_factor"]), tuple(params["long_factor"])
    num_frequencies = int(head_dim * partial) // 2
    if len(short) != num_frequencies or len(long) != num_frequencies:
        raise InvalidModelError(f"longrope needs {num_frequencies} short and long factors (one per rotated "
                                f"pair), got {len(short)} and {len(long)}")
    return RopeConfig(theta=theta, rope_type="longrope", factor=factor, original_max_position_embeddings=original,
                      short_factor=short, long_factor=long, attention_factor=attention_factor,
                      partial_rotary_factor=partial)
