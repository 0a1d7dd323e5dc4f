"""The model families pdserve serves: each Hugging Face architecture as one row of fixed choices.

A row says what the architecture is made of; the folder's config.json supplies the sizes and
the values of those choices (engine/config.py reads it into `ModelConfig.parts`). Families
share one forward (engine/model.py): a row picks parts, it never subclasses.

    Llama      plain: RMSNorm, rope, SwiGLU
    Mistral    + sliding window on every layer (when the config sets one)
    Qwen2      + q/k/v bias; per-layer windows from layer_types
    Qwen3      + per-head RMSNorm on q and k
    Phi3       the checkpoint's qkv_proj and gate_up_proj come fused; longrope
    Mixtral    + top-k mixture of experts, weights renormalised
    Qwen3Moe   + q/k norm, mixture of experts (renormalised if norm_topk_prob)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Family:
    qkv_bias: bool | None = None  # None: the config's attention_bias decides, for o_proj too
    o_bias: bool | None = None
    qk_norm: bool = False  # RMSNorm over each head of q and k, before rope
    window_layers: str = "every"  # "every": sliding_window on every layer; "layer_types": per config.layer_types
    moe: str | None = None  # None: dense MLP; "mixtral" or "qwen3_moe": which config keys size the experts


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(),
    "MistralForCausalLM": Family(),
    "Qwen2ForCausalLM": Family(qkv_bias=True, o_bias=False, window_layers="layer_types"),
    "Qwen3ForCausalLM": Family(qk_norm=True, window_layers="layer_types"),
    "Phi3ForCausalLM": Family(),
    "MixtralForCausalLM": Family(moe="mixtral"),
    "Qwen3MoeForCausalLM": Family(qk_norm=True, moe="qwen3_moe"),
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
