"""The model families pdserve serves: each Hugging Face architecture as one row of fixed choices.

A row says what the architecture is made of; the folder's config.json supplies the sizes and
the values of those choices (engine/config.py reads it into `ModelConfig.parts`). Families
share one forward (engine/model.py): a row picks parts, it never subclasses.

    Llama      plain: RMSNorm, rope, SwiGLU
    Mistral    + a sliding window on every layer (when the config sets one)
    Qwen2      + q/k/v bias; windows on the layers from max_window_layers on (when used)
    Qwen3      + per-head RMSNorm on q and k
    Phi3       the checkpoint's qkv_proj and gate_up_proj come fused; LongRoPE
    Mixtral    + top-k mixture of experts, weights renormalised
    Qwen3Moe   + q/k norm, mixture of experts (renormalised if norm_topk_prob)
    Gemma2     Gemma's parts: (1 + w) norms on both sides of attention and MLP, embeddings
               scaled by sqrt(hidden), query_pre_attn_scalar, GeGLU, final-logit softcap;
               + attention-logit softcap, sliding and global layers alternating
    Gemma3     Gemma's parts + q/k norm; five sliding layers to one global, each kind its own rope
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Family:
    qkv_bias: bool | None = None  # None: the config's attention_bias decides, for o_proj too
    o_bias: bool | None = None
    qk_norm: bool = False  # RMSNorm over each head of q and k, before rope
    gemma: bool = False  # Gemma's parts (above); the config gives the scalar and the final softcap
    attn_softcap: bool = False  # the config's attn_logit_softcapping caps attention scores
    # Which layers slide when the config sets a window: "every" layer; "layer_types" (the config's,
    # or by default the layers from max_window_layers on, or, given `global_every`, all but every
    # n-th layer, n the config's sliding_window_pattern if it has one).
    window_layers: str = "every"
    global_every: int | None = None
    moe: str | None = None  # None: dense MLP; "mixtral" or "qwen3_moe": which config keys size the experts


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(),
    "MistralForCausalLM": Family(),
    "Qwen2ForCausalLM": Family(qkv_bias=True, o_bias=False, window_layers="layer_types"),
    "Qwen3ForCausalLM": Family(qk_norm=True, window_layers="layer_types"),
    "Phi3ForCausalLM": Family(),
    "MixtralForCausalLM": Family(moe="mixtral"),
    "Qwen3MoeForCausalLM": Family(qk_norm=True, moe="qwen3_moe"),
    "Gemma2ForCausalLM": Family(gemma=True, attn_softcap=True, window_layers="layer_types", global_every=2),
    "Gemma3ForCausalLM": Family(gemma=True, qk_norm=True, window_layers="layer_types", global_every=6),
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
