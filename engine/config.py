"""Model configuration read from a Hugging Face folder's config.json.

Only the fields the forward pass needs are kept. The architecture's row (engine/families.py) is
read here and nowhere else: its parts, with the values the config gives them, become `Parts`,
which is all the forward reads beyond the sizes; its checkpoint rules travel as `checkpoint`
(engine/weights.py and the layers' load hooks apply them); RoPE reads to a `RopeConfig` by the
row's rules (engine/rope_config.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pdserve.protocol.errors import InvalidModelError
from pdserve.engine.families import FAMILIES, SUPPORTED_ARCHITECTURES, Checkpoint, Family
from pdserve.engine.rope_config import RopeConfig, read_ropes

HF_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # config's -> engine/model.py's


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
    qk_norm: bool = False  # RMSNorm over each head of q and k, before rope
    norm_adds_one: bool = False  # RMSNorm scales by (1 + w), in fp32, rounding last
    post_norms: bool = False  # norms on attention's and the MLP's outputs too, before the residual add
    scale_embeddings: bool = False  # embeddings times sqrt(hidden)
    query_pre_attn_scalar: float | None = None  # the attention scale is its -1/2 power; None: head_dim's
    attn_logit_softcap: float | None = None  # attention scores s become c * tanh(s / c)
    final_logit_softcap: float | None = None  # the logits likewise
    sliding_window: int | None = None  # a query at position i sees keys j with i - j < sliding_window
    sliding_layers: tuple[int, ...] = ()  # the layers that attend within the window
    local_rope: RopeConfig | None = None  # the sliding layers' rope where it differs from ModelConfig.rope
    activation: str = "silu"  # the gated MLP's: "silu" or "gelu_tanh"
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
    checkpoint: Checkpoint = Checkpoint()

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
        rope, local_rope = read_ropes(raw, head_dim, family.rope)
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
            rope=rope,
            qkv_bias=attention_bias if family.qkv_bias is None else family.qkv_bias,
            o_bias=attention_bias if family.o_bias is None else family.o_bias,
            mlp_bias=raw.get("mlp_bias", False),
            tie_word_embeddings=raw.get("tie_word_embeddings", family.tie_word_embeddings),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype") or "float32",
            parts=_read_parts(raw, family, local_rope),
            checkpoint=family.checkpoint,
        )


def _read_parts(raw: dict, family: Family, local_rope: RopeConfig | None) -> Parts:
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or family.activation
    if activation not in HF_ACTIVATIONS:
        raise InvalidModelError(f"unsupported activation {activation!r}; supported: {', '.join(HF_ACTIVATIONS)}")
    if raw.get("use_bidirectional_attention"):
        raise InvalidModelError("bidirectional attention (an embedding model) is not supported")
    window, sliding_layers = _read_windows(raw, family)
    return Parts(
        qk_norm=family.qk_norm,
        norm_adds_one=family.norm_adds_one,
        post_norms=family.post_norms,
        scale_embeddings=family.scale_embeddings,
        query_pre_attn_scalar=raw.get("query_pre_attn_scalar") if family.query_pre_attn_scalar else None,
        attn_logit_softcap=raw.get("attn_logit_softcapping") if family.attn_softcap else None,
        final_logit_softcap=raw.get("final_logit_softcapping") if family.final_softcap else None,
        sliding_window=window,
        sliding_layers=sliding_layers,
        local_rope=local_rope,
        activation=HF_ACTIVATIONS[activation],
        moe=_read_moe(raw, family),
    )


def _read_windows(raw: dict, family: Family) -> tuple[int | None, tuple[int, ...]]:
    """The sliding window and the layers that slide (engine/families.py says which)."""
    window = raw.get("sliding_window")
    if window is None or raw.get("use_sliding_window") is False:
        return None, ()
    num_layers = raw["num_hidden_layers"]
    if family.window_layers == "every":
        return window, tuple(range(num_layers))
    types = raw.get("layer_types") or _default_layer_types(raw, family)
    return window, tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")


def _default_layer_types(raw: dict, family: Family) -> list[str]:
    num_layers = raw["num_hidden_layers"]
    if family.global_every is None:
        is_sliding = [i >= raw.get("max_window_layers", num_layers) for i in range(num_layers)]
    else:
        period = raw.get("sliding_window_pattern", family.global_every)
        is_sliding = [(i + 1) % period != 0 for i in range(num_layers)]
    return ["sliding_attention" if sliding else "full_attention" for sliding in is_sliding]


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
