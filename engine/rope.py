"""Rotary position embedding: the cos and sin every layer rotates its q and k by
(`kernels.apply_rope`, rotate-half, as Hugging Face Llama/Qwen2/Mistral/Phi-3/Gemma).

Frequencies follow the config: plain `theta ** (-2i / rotary_dim)`, all divided by a linear
`factor`, Llama 3's scaling that divides long wavelengths by `factor` and blends the band between
the two cut-offs, or LongRoPE's per-frequency divisors. With a `partial_rotary_factor` only the
first `rotary_dim` of each head rotates. cos/sin are computed in float32 (times LongRoPE's
attention factor) and cast to the activation dtype, so bf16 runs round like the reference
implementation.

LongRoPE has two sets of divisors, short (within the original context) and long. Which one
rotates a token is fixed for the whole engine: the long set when it serves contexts beyond the
original length (`max_model_len`), as vLLM does. (Transformers picks by each sequence's current
length and recomputes the cache when a sequence crosses over; the prefix cache here is keyed by
tokens alone, so one set must hold for every sequence.)
"""
from __future__ import annotations

import math

import torch

from pdserve.engine.rope_config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int, max_model_len: int) -> torch.Tensor:
    rotary_dim = int(head_dim * rope.partial_rotary_factor)
    theta_powers = rope.theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim)
    if rope.rope_type == "longrope":
        is_long = max_model_len > rope.original_max_position_embeddings
        divisors = torch.tensor(rope.long_factor if is_long else rope.short_factor, dtype=torch.float32)
        return 1.0 / (divisors * theta_powers)  # [rotary_dim // 2]
    inv_freq = 1.0 / theta_powers
    if rope.rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, rope)
    return inv_freq  # [rotary_dim // 2]


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding:
    """Computes cos/sin once per step; every layer applies them to its q and k.

    Not a module buffer on purpose: the frequencies stay float32 whatever the weights' dtype.
    They are computed on the CPU (one result on every device), even while the model around them
    is built on the meta device, then moved to `device`.
    """

    def __init__(self, rope: RopeConfig, head_dim: int, max_model_len: int, device: torch.device):
        with torch.device("cpu"):
            self.inv_freq = inverse_frequencies(rope, head_dim, max_model_len).to(device)
        self.attention_factor = rope.attention_factor

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens] -> cos, sin: [num_tokens, 1, rotary_dim] in dtype
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [num_tokens, rotary_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return (emb.cos() * self.attention_factor).to(dtype), (emb.sin() * self.attention_factor).to(dtype)
