"""Matrix products in int8, weights and activations both (W8A8, vLLM's dynamic per-token int8
scheme): each row of the weight [out, in] and each row (token) of the activations [rows, in] is
held as its int8 levels and scale (kernels/int8_levels.py); the activations' are found on every
call, after each column is multiplied by the layer's input factor f (SmoothQuant's 1 / s: the
weight's columns were multiplied by s, so x W.T is unchanged while the activations' outlier
columns shrink towards the rest).

    x * f = sx[:, None] * qx,   W = sw[:, None] * qW   (rows of levels times their scale)
    x @ W.T = sx[:, None] * (qx @ qW.T) * sw[None, :]

On CPU the product of levels is oneDNN's int8 GEMM (`torch._int_mm`), exact in int32; on a CPU
with AVX512-VNNI it multiplies 64 int8 pairs an instruction where bfloat16's vdpbf16ps multiplies
32. The passes before and after it are compiled (kernels/cpu_int8_rows.py) where they serve.
Elsewhere the levels are multiplied as float32, exact while a row's sum stays within 2^24.

Invariant: `int8_linear(x, ...)` is `int8_linear_reference(x, ...)` up to the rounding of the
float32 sums of levels (exact for in_features up to 1,040: 1040 * 127 * 127 < 2^24).
"""
import torch

from pdserve.kernels import cpu_int8_rows
from pdserve.kernels.int8_levels import int8_levels


def quantize_rows(x: torch.Tensor, factors: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, cols] -> (levels int8 [rows, cols], scales float32 [rows]): `int8_levels` of each
    row of x, each column multiplied by factors float32 [cols] first where given."""
    return cpu_int8_rows.quantize_rows(x, factors) or quantize_rows_reference(x, factors)


def quantize_rows_reference(x: torch.Tensor, factors: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    levels, scales = int8_levels(x.float() if factors is None else x.float() * factors)
    return levels, scales[:, 0]


def int8_linear(x: torch.Tensor, levels: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                input_factors: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in], each column times input_factors float32 [in] where given, times the weight
    held as levels int8 [out, in] and scales float32 [out], plus bias [out]: [rows, out] in x's
    dtype."""
    if not x.is_cpu:
        return int8_linear_reference(x, levels, scales, bias, input_factors)
    x_levels, x_scales = quantize_rows(x, input_factors)
    products = torch._int_mm(x_levels, levels.t())  # [rows, out] int32
    out = cpu_int8_rows.scale_rows(products, x_scales, scales, bias, x.dtype)
    if out is not None:
        return out
    out = torch.mul(products, x_scales[:, None]).mul_(scales).to(x.dtype)
    return out if bias is None else out.add_(bias)


def int8_linear_reference(x, levels, scales, bias, input_factors=None):
    x_levels, x_scales = quantize_rows_reference(x, input_factors)
    out = (x_levels.float() @ levels.float().t() * x_scales[:, None] * scales).to(x.dtype)
    return out if bias is None else out + bias
