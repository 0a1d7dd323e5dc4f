"""Model configuration read from a Hugging Face folder's config.json.

Only the fields the forward pass needs are kept. What the architecture is made of (engine/
families.py) and the values its config gives those choices become `Parts`, which is all the
forward reads beyond the sizes; RoPE reads to a `RopeConfig` (engine/rope_config.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pdserve.engine.errors import InvalidModelError
from pdserve.engine.families import FAMILIES, SUPPORTED_ARCHITECTURES, Family
from pdserve.engine.rope_config import RopeConfig, read_rope

HF_ACTIVATIONS = {"silu": "silu"}  # config's hidden_act -> the gated MLP's activation (engine/model.py)


@dataclass(frozen=True, slots=True)
class MoEConfig:
    num_experts: int
    num_experts_per_tok: int
    intermediate_size: int  # of one expert
    renormalize: bool  # the top-k routing weights are divided by their sum
    layers: tuple[int, ...]  # layers whose MLP is the experts; the others keep a dense MLP


@dataclass(frozen=True, slots=True)
class Parts:
    """The architecture's choices, with the values its config gives them; the defaults are Llama's."""
    qk_norm: bool = False
    sliding_window: int | None = None  # a query at position i sees keys j with i - j < sliding_window
    sliding_layers: tuple[int, ...] = ()  # the layers that attend within the window
    activation: str = "silu"
    moe: MoEConfig | None = None


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
    parts: Parts = Parts()

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise InvalidModelError(f"{model_dir}: no config.json (expected a Hugging Face model folder)")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        architectures = raw.get("architectures") or []
        arch = next((a for a in architectures if a in FAMILIES), None)
        if arch is None:
            raise InvalidModelError(
                f"unsupported architectures {architectures}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        family = FAMILIES[arch]
        num_heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // num_heads
        attention_bias = raw.get("attention_bias", False)
        eos = raw.get("eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            max_position_embeddings=raw["max_position_embeddings"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=read_rope(raw, head_dim),
            qkv_bias=attention_bias if family.qkv_bias is None else family.qkv_bias,
            o_bias=attention_bias if family.o_bias is None else family.o_bias,
            mlp_bias=raw.get("mlp_bias", False),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype") or "float32",
            parts=_read_parts(raw, family),
        )


def _read_parts(raw: dict, family: Family) -> Parts:
    activation = raw.get("hidden_act", "silu")
    if activation not in HF_ACTIVATIONS:
        raise InvalidModelError(f"unsupported activation {activation!r}; supported: {', '.join(HF_ACTIVATIONS)}")
    window, sliding_layers = _read_windows(raw, family)
    if sliding_layers:
        raise InvalidModelError(f"sliding-window attention (window {window} < max positions "
                                f"{raw['max_position_embeddings']}) is not supported")
    return Parts(qk_norm=family.qk_norm, sliding_window=window, sliding_layers=sliding_layers,
                 activation=HF_ACTIVATIONS[activation], moe=_read_moe(raw, family))


def _read_windows(raw: dict, family: Family) -> tuple[int | None, tuple[int, ...]]:
    """The sliding window and the layers that use it; none where the window covers every position."""
    window = raw.get("sliding_window")
    max_positions = raw["max_position_embeddings"]
    if window is None or raw.get("use_sliding_window") is False or window >= max_positions:
        return None, ()
    num_layers = raw["num_hidden_layers"]
    if family.window_layers == "every":
        layers = tuple(range(num_layers))
    else:
        first_sliding = raw.get("max_window_layers", num_layers)
        types = raw.get("layer_types") or [
            "sliding_attention" if i >= first_sliding else "full_attention" for i in range(num_layers)]
        layers = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    return window, layers


def _read_moe(raw: dict, family: Family) -> MoEConfig | None:
    """Mixtral routes every layer's MLP, renormalised; Qwen3-MoE every `decoder_sparse_step`-th
    layer not in `mlp_only_layers`, renormalised if `norm_topk_prob`."""
    if family.moe is None:
        return None
    num_layers = raw["num_hidden_layers"]
    if family.moe == "mixtral":
        config = MoEConfig(raw["num_local_experts"], raw["num_experts_per_tok"], raw["intermediate_size"],
                           renormalize=True, layers=tuple(range(num_layers)))
    else:
        step = raw.get("decoder_sparse_step", 1)
        dense = set(raw.get("mlp_only_layers") or ())
        config = MoEConfig(raw.get("num_experts") or raw["num_local_experts"], raw["num_experts_per_tok"],
                           raw["moe_intermediate_size"], renormalize=raw.get("norm_topk_prob", False),
                           layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0))
    if not 0 < config.num_experts_per_tok <= config.num_experts:
        raise InvalidModelError(f"num_experts_per_tok {config.num_experts_per_tok} must be in "
                                f"[1, num_experts {config.num_experts}]")
    return config


def model_id(model_dir: str | Path) -> str:
    """Names a model by content, not path: a hash of config.json and the weight files' names and
    sizes, so two replicas that mount the same folder at different paths agree."""
    import hashlib

    model_dir = Path(model_dir)
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return f"{model_dir.name}-{digest.hexdigest()[:12]}"
