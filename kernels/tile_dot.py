"""Tile matrix products with one precision switch shared by the attention kernels.

On a GPU, fp16/bf16 tiles go to the tensor cores with fp32 accumulation, while fp32 tiles use
IEEE products instead of TF32 so fp32 attention stays fp32-accurate. The Triton interpreter
multiplies bf16 tiles wrongly, so under the interpreter every product is done in fp32.
"""
import torch
import triton
import triton.language as tl


def needs_exact_dot(dtype: torch.dtype) -> bool:
    return bool(triton.knobs.runtime.interpret) or dtype == torch.float32


@triton.jit
def tile_dot(a, b, EXACT: tl.constexpr):
    """a @ b accumulated in fp32; `a` is cast to `b`'s dtype unless EXACT."""
    if EXACT:
        product = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        product = tl.dot(a.to(b.dtype), b)
    return product
