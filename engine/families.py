"""The model families pdserve serves: each Hugging Face architecture described once, as one row.

A row holds everything that sets its family apart: the parts its decoder is made of, how its
checkpoint names and stores the weights, and how its config.json spells rope. The config gives the
sizes and the values of the parts (the softcaps, the window, the scalar); engine/config.py reads
row and config into a `ModelConfig`, and one forward (engine/model.py) serves every row: a row
picks parts, it never subclasses.

              norm   post   embeds      MLP      q/k   softcaps     sliding layers (config's window)
                     norms                       norm  scores logits
    Llama     w      -      -           SwiGLU   -     -      -     every layer
    Mistral   w      -      -           SwiGLU   -     -      -     every layer
    Qwen2     w      -      -           SwiGLU   -     -      -     from max_window_layers on
    Qwen3     w      -      -           SwiGLU   yes   -      -     from max_window_layers on
    Phi3      w      -      -           SwiGLU   -     -      -     every layer
    Mixtral   w      -      -           experts  -     -      -     every layer
    Qwen3Moe  w      -      -           experts  yes   -      -     every layer
    Gemma2    1 + w  yes    * sqrt(h)   GeGLU    -     yes    yes   all but every 2nd
    Gemma3    1 + w  yes    * sqrt(h)   GeGLU    yes   -      yes   all but every 6th

Beyond the table: Qwen2 biases q/k/v (not o); Gemma scales attention by query_pre_attn_scalar and
ties its embeddings unless told otherwise. Checkpoints keep q/k/v and gate/up apart and the model
fuses them on load, but Phi-3's come fused; Mixtral's experts are renamed from w1/w3/w2 under
block_sparse_moe. Rope: Phi-3 reads its LongRoPE's original context at the top level (4096 if
absent) and takes "su" and "yarn" for "longrope"; Gemma 3's sliding layers rotate with their own
base, `rope_local_base_freq` in older folders.
"""
from __future__ import annotations

from dataclasses import dataclass

from pdserve.engine.rope_config import RopeRules


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """How a family's safetensors name and store its weights, against the model's parameter names."""
    renames: tuple[tuple[str, str], ...] = ()  # (pattern, replacement), re.sub over every name in order
    # True: qkv_proj and gate_up_proj are stored fused, and only so; else q/k/v and gate/up kept
    # apart are fused on load.
    fused: bool = False


@dataclass(frozen=True, slots=True)
class Family:
    # Attention.
    qkv_bias: bool | None = None  # None: the config's attention_bias decides, for o_proj too
    o_bias: bool | None = None
    qk_norm: bool = False  # RMSNorm over each head of q and k, before rope
    query_pre_attn_scalar: bool = False  # the config's query_pre_attn_scalar, not head_dim, sets the scale
    attn_softcap: bool = False  # the config's attn_logit_softcapping caps attention scores
    # Which layers slide when the config sets a window: "every" layer; "layer_types" (the config's,
    # or by default the layers from max_window_layers on, or, given `global_every`, all but every
    # n-th layer, n the config's sliding_window_pattern if it has one).
    window_layers: str = "every"
    global_every: int | None = None
    # The residual stream, the embeddings and the logits.
    norm_adds_one: bool = False  # RMSNorm scales by (1 + w) in fp32, rounding last; else by w after rounding
    post_norms: bool = False  # norms on attention's and the MLP's outputs too, before the residual add
    scale_embeddings: bool = False  # embeddings times sqrt(hidden)
    final_softcap: bool = False  # the config's final_logit_softcapping caps the logits
    tie_word_embeddings: bool = False  # where the config does not say
    # The MLP.
    activation: str = "silu"  # the gated MLP's, where the config names none (HF's spelling)
    moe: str | None = None  # None: dense MLP; "mixtral" or "qwen3_moe": which config keys size the experts
    checkpoint: Checkpoint = Checkpoint()
    rope: RopeRules = RopeRules()


MIXTRAL_EXPERT_NAMES = (
    (r"\.block_sparse_moe\.", ".mlp."),
    (r"(\.experts\.\d+)\.w1\.", r"\1.gate_proj."),
    (r"(\.experts\.\d+)\.w3\.", r"\1.up_proj."),
    (r"(\.experts\.\d+)\.w2\.", r"\1.down_proj."),
)

FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(),
    "MistralForCausalLM": Family(),
    "Qwen2ForCausalLM": Family(qkv_bias=True, o_bias=False, window_layers="layer_types"),
    "Qwen3ForCausalLM": Family(qk_norm=True, window_layers="layer_types"),
    "Phi3ForCausalLM": Family(
        checkpoint=Checkpoint(fused=True),
        rope=RopeRules(type_aliases=(("su", "longrope"), ("yarn", "longrope")), original_context=4096)),
    "MixtralForCausalLM": Family(moe="mixtral", checkpoint=Checkpoint(renames=MIXTRAL_EXPERT_NAMES)),
    "Qwen3MoeForCausalLM": Family(qk_norm=True, moe="qwen3_moe"),
    "Gemma2ForCausalLM": Family(
        query_pre_attn_scalar=True, attn_softcap=True, window_layers="layer_types", global_every=2,
        norm_adds_one=True, post_norms=True, scale_embeddings=True, final_softcap=True, tie_word_embeddings=True,
        activation="gelu_pytorch_tanh"),
    "Gemma3ForCausalLM": Family(
        qk_norm=True, query_pre_attn_scalar=True, window_layers="layer_types", global_every=6,
        norm_adds_one=True, post_norms=True, scale_embeddings=True, final_softcap=True, tie_word_embeddings=True,
        activation="gelu_pytorch_tanh", rope=RopeRules(local_theta_key="rope_local_base_freq")),
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
