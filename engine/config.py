"""Model configuration read from a Hugging Face folder's config.json.

Only the fields the forward pass needs are kept. Older folders spell RoPE as `rope_theta` +
`rope_scaling`, newer ones as `rope_parameters`; both read to the same `RopeConfig`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pdserve.engine.errors import InvalidModelError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"  # "default" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise InvalidModelError(f"{model_dir}: no config.json (expected a Hugging Face model folder)")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        architectures = raw.get("architectures") or []
        arch = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise InvalidModelError(
                f"unsupported architectures {architectures}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        _reject_sliding_window(raw)
        num_heads = raw["num_attention_heads"]
        is_qwen2 = arch == "Qwen2ForCausalLM"
        eos = raw.get("eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            max_position_embeddings=raw["max_position_embeddings"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=_read_rope(raw),
            qkv_bias=True if is_qwen2 else raw.get("attention_bias", False),
            o_bias=False if is_qwen2 else raw.get("attention_bias", False),
            mlp_bias=raw.get("mlp_bias", False),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype") or "float32",
        )


def _read_rope(raw: dict) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.pop("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise InvalidModelError(f"unsupported rope type {rope_type!r}; supported: default, llama3")
    if rope_type == "default":
        return RopeConfig(theta=theta)
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=params["factor"],
        low_freq_factor=params["low_freq_factor"],
        high_freq_factor=params["high_freq_factor"],
        original_max_position_embeddings=params["original_max_position_embeddings"],
    )


def _reject_sliding_window(raw: dict) -> None:
    window = raw.get("sliding_window")
    in_use = raw.get("use_sliding_window", True)
    if window is not None and in_use and window < raw["max_position_embeddings"]:
        raise InvalidModelError(
            f"sliding-window attention (window {window} < max positions "
            f"{raw['max_position_embeddings']}) is not supported")


def model_id(model_dir: str | Path) -> str:
    """Names a model by content, not path: a hash of config.json and the weight files' names and
    sizes, so two replicas that mount the same folder at different paths agree."""
    import hashlib

    model_dir = Path(model_dir)
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return f"{model_dir.name}-{digest.hexdigest()[:12]}"
