"""Symmetric int8 levels of a row: the one rounding that the 8-bit KV pool's entries
(kernels/kv_quant.py) and the W8A8 products' weights and activations (kernels/int8_linear.py)
share, in torch and in C (csrc/int8_levels.h) alike.

    s = max_i |x_i| / 127,  q_i = round(x_i / s) in [-127, 127], half to even;  x_i ~= s * q_i
    (s = 0 and q = 0 for a row of zeros)

computed in float32 from the values as given.
"""
import torch

MAX_LEVEL = 127


def int8_levels(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., n] -> (levels int8 [..., n], scales float32 [..., 1])."""
    x = x.float()
    scales = x.abs().amax(dim=-1, keepdim=True) / MAX_LEVEL
    levels = torch.where(scales > 0, x / scales, 0.0).round_().clamp_(-MAX_LEVEL, MAX_LEVEL).to(torch.int8)
    return levels, scales
