"""Linear layers on Q4_0 and Q4_1 weights repacked for integer dot products, times activations
quantized to int8 per block of 32, for CPU, compiled: `csrc/packed_q4_linear.c` (the layout and
the arithmetic are its header's), built on first use (kernels/cpu_build.py).

`pack(blocks, block_type)` reorders a stored weight [N, (K / 32) * block_bytes] into groups of 16
output features, [N / 16, (K / 32) * group_block_bytes]: the same bytes, each group's scales side
by side and its levels in the order the dot products read them. `unpack` is its inverse
(compiled), for a prefill's many rows where they dequantize the stored layout for a GEMM. The
product then costs a block its scales and 8 integer dot-product instructions for 16 features,
where the float kernel (kernels/cpu_block_linear.py) unpacks every weight to bfloat16. On one core
of an AMD EPYC (AVX512-VNNI), SmolLM2-135M's 30 layers of Q4_1 projections, cold as in a decode
step, bfloat16 x: 3.0-3.1 ms for one row against 5.5-5.7 for the float kernel, 6.8-6.9 against
10.3-10.6 for 8 rows, 13 against 19 for 16. From 16 rows the library multiplies in strips
(`has_strips`), 0.71-0.77x the bfloat16 GEMM's time for 256 rows on that core.

Numerics: x is quantized as llama.cpp's Q8_1 activations are (levels round(x * 127 / amax) per
block of 32; the block's float sum for the Q4_1 minimum), so the product is not the dequantized
weight's up to summation order; `reference` is what it computes, in torch. A row's product is the
same bit for bit whatever other rows and thread count it is computed with.

`linear` returns None when it cannot serve its arguments (a tensor not on the CPU or not
contiguous, x neither float32 nor bfloat16, no compiler, `PDSERVE_CPU_KERNELS=0`).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.block_quant_reference import BLOCK_TYPES, WEIGHTS_PER_BLOCK
from pdserve.kernels.cpu_build import enabled, load_library

SOURCE_NAME = "packed_q4_linear.c"
PACKED_TYPES = ("q4_0", "q4_1")
FEATURES_PER_GROUP = 16
FLAGS = ("-fno-associative-math",)  # each block's sum of x in order, as the portable C sums it
_POINTER, _INT64, _INT32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32


def packs(block_type: str, out_features: int) -> bool:
    """Whether a weight of `block_type` with `out_features` rows can be packed."""
    return block_type in PACKED_TYPES and out_features % FEATURES_PER_GROUP == 0


def pack(blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    """A stored weight uint8 [N, num_blocks * block_bytes] as uint8 [N / 16, num_blocks * group_block_bytes]."""
    num_scales = _num_scales(block_type)
    groups, num_blocks = _grouping(blocks.shape[0], blocks.shape[1], BLOCK_TYPES[block_type].block_bytes)
    by_block = blocks.view(groups, FEATURES_PER_GROUP, num_blocks, -1).transpose(1, 2)  # [G, nb, 16, bytes]
    scales = by_block[..., :2 * num_scales].reshape(groups, num_blocks, FEATURES_PER_GROUP, num_scales, 2)
    levels = by_block[..., 2 * num_scales:].reshape(groups, num_blocks, FEATURES_PER_GROUP, 4, 4)
    return torch.cat([scales.transpose(2, 3).reshape(groups, num_blocks, -1),
                      levels.transpose(2, 3).reshape(groups, num_blocks, -1)], dim=-1).reshape(groups, -1)


def unpack(packed: torch.Tensor, block_type: str, *, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """`pack`'s inverse, uint8 [N, num_blocks * block_bytes], written into `out` when given (a
    buffer kept across calls); None when the library cannot serve it."""
    out_features, in_features = _shape(packed.shape, packed.dtype, block_type)
    shape = (out_features, in_features // WEIGHTS_PER_BLOCK * BLOCK_TYPES[block_type].block_bytes)
    if out is not None and (out.shape != shape or out.dtype != torch.uint8):
        raise ValueError(f"out {out.dtype} {list(out.shape)} is not uint8 {list(shape)}")
    library = load()
    if library is None or not (packed.is_cpu and packed.is_contiguous()) or (
            out is not None and not (out.is_cpu and out.is_contiguous())):
        return None
    out = torch.empty(shape, dtype=torch.uint8) if out is None else out
    _check(library.packed_q4_unpack(out.data_ptr(), packed.data_ptr(), BLOCK_TYPES[block_type].ggml_type,
                                    out_features, in_features, torch.get_num_threads()), "packed_q4_unpack")
    return out


@functools.cache
def load() -> ctypes.CDLL | None:
    return build() if enabled() else None


def build(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built with FLAGS + extra_flags (the tests build the portable C with AVX-512 off),
    its functions declared; None when it cannot be built."""
    library = load_library(SOURCE_NAME, FLAGS + extra_flags)
    if library is not None:
        library.packed_q4_linear.argtypes = [_POINTER] * 3 + [_INT32] + [_INT64] * 3 + [_INT32] * 2
        library.packed_q4_unpack.argtypes = [_POINTER] * 2 + [_INT32] + [_INT64] * 2 + [_INT32]
        library.packed_q4_linear.restype = library.packed_q4_unpack.restype = _INT64
        library.packed_q4_strips.argtypes, library.packed_q4_strips.restype = [], _INT64
    return library


def has_strips() -> bool:
    """Whether this machine's build multiplies many rows in strips (AVX512-VNNI): faster than the
    GEMM on the dequantized weight, where the GEMM has no AMX tiles."""
    library = load()
    return library is not None and bool(library.packed_q4_strips())


def linear(x: torch.Tensor, packed: torch.Tensor, block_type: str, *,
           library: ctypes.CDLL | None = None) -> torch.Tensor | None:
    """x [M, K] float32 or bfloat16 times the packed weight [N, K], transposed: [M, N] in x.dtype
    (computed by `library` when given, else by this machine's build)."""
    out_features, in_features = _shape(packed.shape, packed.dtype, block_type)
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"x {list(x.shape)} does not match a {block_type} weight of {in_features} in-features")
    library = library or load()
    if (library is None or x.dtype not in (torch.float32, torch.bfloat16) or not (x.is_cpu and packed.is_cpu)
            or not (x.is_contiguous() and packed.is_contiguous())):
        return None
    out = torch.empty(x.shape[0], out_features, dtype=x.dtype)
    _check(library.packed_q4_linear(out.data_ptr(), x.data_ptr(), packed.data_ptr(), BLOCK_TYPES[block_type].ggml_type,
                                    x.shape[0], out_features, in_features, x.dtype == torch.bfloat16,
                                    torch.get_num_threads()), "packed_q4_linear")
    return out


def reference(x: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    """What `linear` computes, from the stored blocks, in float64: [M, N]."""
    x_blocks = x.float().view(x.shape[0], -1, WEIGHTS_PER_BLOCK)  # [M, nb, 32]
    amax = x_blocks.abs().amax(dim=-1, keepdim=True)
    # (127 divided by amax, rounded once: torch computes `127.0 / amax` as 127.0 * (1 / amax))
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    levels = torch.round(x_blocks * inverse).double()  # float32 product, rounded to nearest even
    dx, sx = (amax / 127.0).double(), x_blocks.sum(dim=-1, keepdim=True).double()
    stored = blocks.view(blocks.shape[0], -1, BLOCK_TYPES[block_type].block_bytes)  # [N, nb, bytes]
    d = stored[..., 0:2].contiguous().view(torch.float16).double()  # [N, nb, 1]
    m = stored[..., 2:4].contiguous().view(torch.float16).double() if block_type == "q4_1" else -8 * d
    qs = stored[..., 2 * _num_scales(block_type):]
    weight_levels = torch.cat([qs & 15, qs >> 4], dim=-1).double()  # [N, nb, 32]
    dots = torch.einsum("mbi,nbi->mnb", levels, weight_levels)
    return (dots * dx.squeeze(-1)[:, None, :] * d.squeeze(-1)[None]).sum(-1) + (sx.squeeze(-1) @ m.squeeze(-1).T)


def _check(status: int, what: str) -> None:
    if status:
        raise (MemoryError if status == 2 else ValueError)(f"{what}: status {status}")


def _num_scales(block_type: str) -> int:
    if block_type not in PACKED_TYPES:
        raise ValueError(f"block type {block_type!r} cannot be packed: expected one of {PACKED_TYPES}")
    return 2 if block_type == "q4_1" else 1


def _grouping(num_rows: int, row_bytes: int, block_bytes: int) -> tuple[int, int]:
    if num_rows % FEATURES_PER_GROUP or row_bytes % block_bytes:
        raise ValueError(f"a weight of {num_rows} rows of {row_bytes} bytes is no whole number of groups of "
                         f"{FEATURES_PER_GROUP} rows of {block_bytes}-byte blocks")
    return num_rows // FEATURES_PER_GROUP, row_bytes // block_bytes


@functools.cache
def _shape(shape: torch.Size, dtype: torch.dtype, block_type: str) -> tuple[int, int]:
    """(N, K) of a packed weight of `shape` and `dtype` (cached: a decode step asks for each layer's)."""
    _num_scales(block_type)
    group_block_bytes = FEATURES_PER_GROUP * BLOCK_TYPES[block_type].block_bytes
    if dtype != torch.uint8 or len(shape) != 2 or shape[1] % group_block_bytes:
        raise ValueError(f"packed {block_type} weights must be uint8 [N / 16, num_blocks * {group_block_bytes}], "
                         f"not {dtype} {list(shape)}")
    return shape[0] * FEATURES_PER_GROUP, shape[1] // group_block_bytes * WEIGHTS_PER_BLOCK
