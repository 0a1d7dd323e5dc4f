"""Calls into a compiled library of block-weight kernels for CPU: `csrc/block_linear.c` (GGUF's
32-weight blocks) and `csrc/kquant_linear.c` (its 256-weight K-quant super-blocks) export alike,
for a symbol prefix P:

    int64_t P_linear(float *out, const void *x, const uint8_t *blocks, int32_t block_type,
                     int64_t num_rows, int64_t out_features, int64_t in_features,
                     int32_t x_is_bfloat16, int32_t num_threads)
    int64_t P_dequantize(void *out, const uint8_t *blocks, int32_t block_type, int64_t out_features,
                         int64_t in_features, int32_t out_is_bfloat16, int32_t num_threads)
    int32_t P_linear_rounds_bfloat16_weights(void)

the first two returning 0, 1 (arguments rejected) or 2 (no scratch memory). `linear` and
`dequantize` check their arguments as the reference does (ValueError: an unknown block type,
blocks whose width is no whole number of blocks, x whose width is not the weight's), then return
None where the library cannot serve them (no library, a tensor not on the CPU or not contiguous, a
dtype neither float32 nor bfloat16): the caller runs the reference then. The library is called
through `ctypes`, which releases the GIL for the call, on `torch.get_num_threads()` threads.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from pdserve.kernels.block_quant_reference import BlockType, row_in_features
from pdserve.kernels.cpu_build import load_library

_POINTER, _INT64, _INT32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
_FLOAT_DTYPES = (torch.float32, torch.bfloat16)
Loader = Callable[[], ctypes.CDLL | None]


@dataclass(frozen=True, slots=True)
class BlockKernels:
    source_name: str  # in csrc/
    prefix: str  # of its symbols
    block_types: Mapping[str, BlockType]

    def build(self, flags: tuple[str, ...]) -> ctypes.CDLL | None:
        """The library built with `flags`, its functions declared; None when it cannot be built."""
        library = load_library(self.source_name, flags)
        if library is None:
            return None
        linear, dequantize, rounds = self._functions(library)
        linear.argtypes = [_POINTER] * 3 + [_INT32] + [_INT64] * 3 + [_INT32] * 2
        dequantize.argtypes = [_POINTER] * 2 + [_INT32] + [_INT64] * 2 + [_INT32] * 2
        linear.restype = dequantize.restype = _INT64
        rounds.argtypes, rounds.restype = [], _INT32
        return library

    def rounds_bfloat16_weights(self, library: ctypes.CDLL | None) -> bool:
        """Whether `library` multiplies bfloat16 x by the weight rounded to bfloat16 (built with
        AVX512-BF16), not the exact float32 weight; False when there is no library."""
        return library is not None and bool(self._functions(library)[2]())

    def linear(self, load: Loader, x: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor | None:
        """x [M, K] float32 or bfloat16 times the weight [N, K] held as `blocks`, transposed: [M, N]
        in x.dtype, summed in float32."""
        in_features = self.in_features_of(blocks, block_type)
        if x.dim() != 2 or x.shape[1] != in_features:
            raise ValueError(f"x {list(x.shape)} does not match a {block_type} weight of {in_features} in-features")
        library = load()
        if (library is None or x.dtype not in _FLOAT_DTYPES or not (x.is_cpu and blocks.is_cpu)
                or not (x.is_contiguous() and blocks.is_contiguous())):
            return None
        out = torch.empty(x.shape[0], blocks.shape[0], dtype=torch.float32)
        _check(self._functions(library)[0](
            out.data_ptr(), x.data_ptr(), blocks.data_ptr(), self.block_types[block_type].ggml_type, x.shape[0],
            blocks.shape[0], in_features, x.dtype == torch.bfloat16, torch.get_num_threads()), f"{self.prefix}_linear")
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def dequantize(self, load: Loader, blocks: torch.Tensor, block_type: str, dtype: torch.dtype,
                   out: torch.Tensor | None) -> torch.Tensor | None:
        """The weight [N, K] in dtype (float32, or bfloat16 rounded to nearest even), written into
        `out` when given (contiguous [N, K] of dtype)."""
        in_features = self.in_features_of(blocks, block_type)
        if out is not None and (out.shape != (blocks.shape[0], in_features) or out.dtype != dtype):
            raise ValueError(f"out {out.dtype} {list(out.shape)} is not {dtype} {[blocks.shape[0], in_features]}")
        library = load()
        if (library is None or dtype not in _FLOAT_DTYPES or not blocks.is_cpu or not blocks.is_contiguous()
                or (out is not None and not (out.is_cpu and out.is_contiguous()))):
            return None
        if out is None:
            out = torch.empty(blocks.shape[0], in_features, dtype=dtype)
        _check(self._functions(library)[1](
            out.data_ptr(), blocks.data_ptr(), self.block_types[block_type].ggml_type, blocks.shape[0], in_features,
            dtype == torch.bfloat16, torch.get_num_threads()), f"{self.prefix}_dequantize")
        return out

    def in_features_of(self, blocks: torch.Tensor, block_type: str) -> int:
        if block_type not in self.block_types:
            raise ValueError(f"unknown block type {block_type!r}: expected one of {sorted(self.block_types)}")
        return row_in_features(blocks, self.block_types[block_type])

    def _functions(self, library: ctypes.CDLL) -> tuple:
        """The library's P_linear, P_dequantize and P_linear_rounds_bfloat16_weights."""
        return tuple(getattr(library, f"{self.prefix}_{name}")
                     for name in ("linear", "dequantize", "linear_rounds_bfloat16_weights"))


def _check(status: int, what: str) -> None:
    if status == 2:
        raise MemoryError(f"{what}: no scratch memory")
    if status:
        raise ValueError(f"{what}: arguments rejected by the kernel (status {status})")
