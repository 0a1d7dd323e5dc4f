"""A decoder layer's elementwise ops, one function each, served by what fits the tensors: the
compiled CPU op (kernels/cpu_layer_ops.py) where it serves them (CPU, float32 or bfloat16,
contiguous where it must be, a C compiler, `PDSERVE_CPU_KERNELS` not 0), else the torch reference
(kernels/layer_ops_reference.py), which is the CUDA path too. Either gives the reference's result
but for summation order and SiLU's last float32 bit.

Two ops may write into their input, so callers hand over tensors they no longer need as they
were: `add_rms_norm` may sum into `residual`, `apply_rope` may rotate `x` in place.
"""
import torch

import pdserve.kernels.cpu_layer_ops as cpu_layer_ops
from pdserve.kernels.layer_ops_reference import (
    add_rms_norm_reference,
    gelu_tanh_and_mul_reference,
    rms_norm_reference,
    rope_reference,
    silu_and_mul_reference,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, adds_one: bool = False) -> torch.Tensor:
    """x [..., hidden] normalised and scaled by weight [hidden] (by 1 + weight where `adds_one`)."""
    out = cpu_layer_ops.rms_norm(x, weight, eps, adds_one)
    return rms_norm_reference(x, weight, eps, adds_one) if out is None else out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 adds_one: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x), x and residual [..., hidden]; the sum may be
    written into residual."""
    out = cpu_layer_ops.add_rms_norm(x, residual, weight, eps, adds_one)
    return add_rms_norm_reference(x, residual, weight, eps, adds_one) if out is None else (out, residual)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2 * width], gate then up: silu(gate) * up [..., width] (SwiGLU)."""
    out = cpu_layer_ops.silu_and_mul(gate_up)
    return silu_and_mul_reference(gate_up) if out is None else out


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2 * width], gate then up: gelu_tanh(gate) * up [..., width] (GeGLU)."""
    return gelu_tanh_and_mul_reference(gate_up)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, num_heads, head_dim] rotated by cos, sin [num_tokens, 1, rotary_dim]; may
    rotate x in place (a view into a fused projection will do)."""
    rotated = cpu_layer_ops.rotary_(x, cos, sin)
    return rope_reference(x, cos, sin) if rotated is None else rotated
