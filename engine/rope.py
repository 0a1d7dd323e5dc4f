"""Rotary position embedding (rotate-half convention, as Hugging Face Llama/Qwen2/Mistral).

Frequencies follow the config: plain `theta ** (-2i / head_dim)`, or Llama 3's scaling that
divides long wavelengths by `factor` and blends the band between the two cut-offs.
cos/sin are computed in float32 and cast to the activation dtype, so bf16 runs round like the
reference implementation.
"""
from __future__ import annotations

import math

import torch

from pdserve.engine.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if rope.rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, rope)
    return inv_freq  # [head_dim // 2]


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

    def __init__(self, rope: RopeConfig, head_dim: int, device: torch.device):
        with torch.device("cpu"):
            self.inv_freq = inverse_frequencies(rope, head_dim).to(device)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [num_tokens] -> cos, sin: [num_tokens, 1, head_dim] in dtype
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [num_tokens, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [num_tokens, num_heads, head_dim]
    return x * cos + _rotate_half(x) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
