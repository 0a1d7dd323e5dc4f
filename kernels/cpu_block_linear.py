"""Linear layers on GGUF block-quantized weights (Q8_0, Q4_0, Q4_1) for CPU, compiled:
`csrc/block_linear.c`, built on first use (kernels/cpu_build.py). The layouts and the exact
dequantization are `kernels/block_quant_reference.py`'s.

`block_linear(x, blocks, block_type)` multiplies activations by the weight without dequantizing it
whole: each block is unpacked in registers as it is read, so a decode step reads the weight's
0.56 (Q4_0) to 1.06 (Q8_0) bytes a weight instead of bfloat16's 2. `dequantize(blocks, block_type,
dtype)` writes the whole weight, for a prefill's many rows (dequantize, then a float GEMM).

On one core of a 2-vCPU AMD EPYC (Zen 4), SmolLM2-135M in Q4_1 with a Q8_0 LM head, its weights
cold as in a decode step (30 layers' copies), bfloat16 x: the projections and head take ~11 ms for
one row, where PackedLinear takes ~21 ms on the weights in bfloat16; with AVX512-BF16 each further
row costs one bfloat16 pair multiply-add a weight pair (vdpbf16ps), ~24 ms for 8 rows (PackedLinear
~23) and ~41 for 16 (PackedLinear ~31), so from about 8 rows PackedLinear in bfloat16 is as fast.
Float32 x costs two float32 multiply-adds a weight a row (~31 ms for 8 rows).

A row's product is the same bit for bit whatever other rows and thread count it is computed
with. It equals x.float() @ dequantized.T but for summation order, except that where the library
is built with AVX512-BF16 (`rounds_bfloat16_weights()`), bfloat16 x multiplies the weight rounded
to bfloat16 (round to nearest even, as `dequantize(..., torch.bfloat16)` rounds it): then it equals
x.float() @ dequantize(blocks, block_type, torch.bfloat16).float().T but for summation order, what
a bfloat16 model and the dequantize-then-GEMM path compute.

Both return None when they cannot serve their arguments (a tensor not on the CPU or not
contiguous, x neither float32 nor bfloat16, no compiler, `PDSERVE_CPU_KERNELS=0`): the caller runs
the reference then. Arguments the reference rejects raise ValueError, as it does. The calls are
kernels/cpu_block_kernels.py's, shared with the other block kernels' library.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.block_quant_reference import BLOCK_TYPES
from pdserve.kernels.cpu_block_kernels import BlockKernels
from pdserve.kernels.cpu_build import enabled

KERNELS = BlockKernels("block_linear.c", "block", BLOCK_TYPES)
FLAGS: tuple[str, ...] = ()


@functools.cache
def load() -> ctypes.CDLL | None:
    return build() if enabled() else None


def build(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built with FLAGS + extra_flags (the tests build the portable C with AVX-512 off),
    its functions declared; None when it cannot be built."""
    return KERNELS.build(FLAGS + extra_flags)


def rounds_bfloat16_weights(library: ctypes.CDLL | None = None) -> bool:
    """Whether `block_linear` (or `library`'s) multiplies bfloat16 x by the weight rounded to
    bfloat16 (built with AVX512-BF16), not the exact float32 weight; False when there is no library."""
    return KERNELS.rounds_bfloat16_weights(library or load())


def block_linear(x: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor | None:
    """x [M, K] float32 or bfloat16 times the weight [N, K] held as `blocks`, transposed: [M, N] in
    x.dtype, summed in float32."""
    return KERNELS.linear(load, x, blocks, block_type)


def dequantize(blocks: torch.Tensor, block_type: str, dtype: torch.dtype = torch.float32, *,
               out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The weight [N, K] in dtype (float32, or bfloat16 rounded to nearest even) from `blocks`,
    written into `out` when given (contiguous [N, K] of dtype: a buffer kept across calls spares
    the page faults of a fresh one)."""
    return KERNELS.dequantize(load, blocks, block_type, dtype, out)
