"""Tiny transformers configs of the families the engine serves, shared by the tests that check
them against transformers: through `LLM` (tests/engine/test_families.py) and through `pdserve up`
(tests/system/test_families_up.py). The `hf_model` fixture writes a checkpoint for any of them.

The shapes vary head dims, GQA ratios and tied embeddings across families; the sliding windows
(10 to 12 positions) are narrower than most test prompts.
"""
from transformers import (
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

VOCAB_SIZE = 512
SHAPE = dict(vocab_size=VOCAB_SIZE, max_position_embeddings=1024, num_hidden_layers=2)
PHI3_ORIGINAL_CONTEXT = 32  # phi3_longrope_config's; transformers rotates with the long factors beyond it


def llama_config() -> LlamaConfig:
    """head_dim 16, GQA 2; untied"""
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, **SHAPE)


def qwen2_sliding_config() -> Qwen2Config:
    """head_dim 16, GQA 2, q/k/v biases; layer 1 slides over 12 positions, layer 0 attends to all"""
    return Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                       use_sliding_window=True, sliding_window=12, max_window_layers=1, **SHAPE)


def qwen3_sliding_config() -> Qwen3Config:
    """no GQA; layer 1 slides over 12 positions, layer 0 attends to all"""
    return Qwen3Config(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
                       head_dim=32, use_sliding_window=True, sliding_window=12, max_window_layers=1, **SHAPE)


def phi3_longrope_config() -> Phi3Config:
    """Phi-4-mini's shape of LongRoPE: 3/4 of each head rotates, GQA 3, tied; an original context
    of PHI3_ORIGINAL_CONTEXT positions within 1024."""
    rotated_pairs = 6  # head_dim 16 * 0.75 / 2
    return Phi3Config(hidden_size=96, intermediate_size=192, num_attention_heads=6, num_key_value_heads=2,
                      partial_rotary_factor=0.75, tie_word_embeddings=True,
                      original_max_position_embeddings=PHI3_ORIGINAL_CONTEXT,
                      rope_scaling={"type": "longrope", "short_factor": [1.0 + i / 4 for i in range(rotated_pairs)],
                                    "long_factor": [2.0 + i for i in range(rotated_pairs)]},
                      **SHAPE)


def mixtral_config() -> MixtralConfig:
    """head_dim 16, GQA 4, 4 experts of which 2 per token; untied"""
    return MixtralConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=1,
                         num_local_experts=4, num_experts_per_tok=2, **SHAPE)


QWEN3_MOE_LAYOUTS = [
    dict(norm_topk_prob=True, mlp_only_layers=[1]),  # layer 1 keeps a dense MLP
    dict(norm_topk_prob=False, decoder_sparse_step=2, num_hidden_layers=4),  # experts in layers 1 and 3
]


def qwen3_moe_config(**layout) -> Qwen3MoeConfig:
    """head_dim 32, GQA 2, 8 experts of which 3 per token; tied"""
    return Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=48, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=3,
                          tie_word_embeddings=True, **{**SHAPE, **layout})


def mistral_config() -> MistralConfig:
    """head_dim 24, GQA 2, a window of 12 positions in every layer"""
    return MistralConfig(hidden_size=96, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=24, sliding_window=12, **SHAPE)


def gemma2_config() -> Gemma2Config:
    """head_dim 32 (not hidden / heads), GQA 2, tied; caps low enough to bind, a scalar not
    head_dim; layers 0 and 2 slide over 12 positions"""
    return Gemma2Config(hidden_size=96, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, query_pre_attn_scalar=20, attn_logit_softcapping=5.0,
                        final_logit_softcapping=3.0, sliding_window=12, **{**SHAPE, "num_hidden_layers": 3})


def gemma3_config() -> Gemma3TextConfig:
    """head_dim 32, GQA 4, tied; 7 layers, five sliding over 10 positions to one global; the
    global layers' rope linearly scaled, the local ones' plain"""
    return Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        query_pre_attn_scalar=24, sliding_window=10,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        **{**SHAPE, "num_hidden_layers": 7})
