"""Linear layers whose weights stay in a GGUF block format (Q8_0, Q4_0, Q4_1, and the K-quants
Q4_K, Q6_K), as stored.

A decode step reads every weight once, so its floor is the weights' bytes: SmolLM2-135M's Q4_1
matrices are 0.625 bytes a weight (20-byte blocks of 32) against 2 in bfloat16 and 4 in float32.
On CPU, a few rows (a decode step) multiply the blocks directly, each block unpacked in registers
(kernels/cpu_block_linear.py); more rows (a prefill chunk) dequantize the weight to the
activations' dtype and run the GEMM, where the product outweighs the unpacking. On CUDA, rows of
any number go through the Triton kernel (kernels/triton_block_linear.py), which unpacks the blocks
in registers tile by tile and feeds the tensor cores. The K-quants have their own CPU kernel
(kernels/cpu_kquant_linear.py, super-blocks of 256 weights) and no Triton one: on CUDA their weight
is dequantized by the torch reference (kernels/kquant_reference.py) for every call.

With `int8_activations` a Q4 weight on the CPU is packed at load for
kernels/cpu_packed_q4_linear.py: up to MAX_PACKED_KERNEL_ROWS rows are quantized to int8 per block
of 32 and multiplied in integers (llama.cpp's numerics; on the real model within the bfloat16
rule, tests/real_model/test_as_stored.py); more are unpacked into a scratch copy of the stored
layout, then dequantized for the GEMM as above. With `int8_prefill` too, the kernel serves a
prefill's rows as well where that is faster (`max_packed_kernel_rows`); on the real model that
costs the bfloat16 rule (mean logprob error 0.076 nats against its 0.05).

Invariant: a `BlockLinear` computes what `nn.Linear` computes with the dequantized weight (gguf's
float32 dequantization, bit for bit) and the same bias, up to summation order, but for the rows
of a packed one's int8 kernel; with bfloat16 activations the GEMM path on CPU and the tensor
cores on CUDA multiply by the weight rounded to bfloat16, as a bfloat16 model does.
"""
from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from pdserve.engine.cpu_features import cpu_has_amx
from pdserve.engine.linear_layers import replace_linear_layers
from pdserve.kernels import (block_quant_reference, cpu_block_linear, cpu_kquant_linear, cpu_packed_q4_linear,
                             kquant_reference)

# Up to this many rows the blocks are multiplied as stored; beyond it, dequantized for the GEMM.
# Measured on a decode step of SmolLM2-135M (Q4_1, a Q8_0 head, cold) on one core of an AMD EPYC
# (Zen 4, AVX512-BF16): in bfloat16 the kernel takes 11 ms at 1 row against 21 for the GEMM on
# resident bfloat16 weights, 24 ms at 8 rows, 41 at 16 against about 39 dequantized first; in
# float32 (multiply-adds at half bfloat16's rate) the two meet at about 32 rows.
MAX_BLOCK_KERNEL_ROWS = {torch.bfloat16: 12, torch.float32: 32}
# The same for Q4 weights packed for int8 activations (kernels/cpu_packed_q4_linear.py), in either
# dtype: on that core the 30 layers' projections took 3.1 ms at 1 row, 13 at 16 and 24 at 32,
# where unpacking, dequantizing and the bfloat16 GEMM took about as long as from 32 rows.
MAX_PACKED_KERNEL_ROWS = 32


def max_packed_kernel_rows(int8_prefill: bool) -> float:
    """Up to how many rows a packed weight's kernel serves: MAX_PACKED_KERNEL_ROWS, or with
    `int8_prefill` any number where the kernel multiplies many rows in strips (AVX512-VNNI) and no
    AMX tiles outrun it in bfloat16. There, on one core of an AMD EPYC with AVX512-VNNI and
    AVX512-BF16, SmolLM2's 30 layers of Q4_1 projections take 86-103 ms for 256 bfloat16 rows
    against 120-135 for the GEMM on resident bfloat16 weights and 132-153 dequantized first."""
    if int8_prefill and cpu_packed_q4_linear.has_strips() and not cpu_has_amx():
        return math.inf
    return MAX_PACKED_KERNEL_ROWS


class BlockLinear(nn.Module):
    def __init__(self, blocks: torch.Tensor, block_type: str, in_features: int, bias: torch.Tensor | None,
                 int8_activations: bool = False, int8_prefill: bool = False):
        """blocks: uint8 [out_features, row bytes], each row its blocks back to back. With
        `int8_activations`, a Q4 weight on the CPU is packed for the int8 kernel, which then serves
        up to `max_kernel_rows` rows (a few, or with `int8_prefill` where faster any number); more
        rows, and every other weight, are served as without."""
        super().__init__()
        if block_reference(block_type).in_features_of(blocks, block_type) != in_features:
            raise ValueError(f"{block_type} blocks {list(blocks.shape)} do not hold {in_features} in-features")
        self.in_features, self.out_features = in_features, blocks.shape[0]
        self.block_type = block_type
        self.packed = (int8_activations and blocks.is_cpu and cpu_packed_q4_linear.packs(block_type, blocks.shape[0])
                       and cpu_packed_q4_linear.load() is not None)
        self.register_buffer("blocks", cpu_packed_q4_linear.pack(blocks, block_type) if self.packed else blocks)
        self.bias = bias
        self.max_kernel_rows = max_packed_kernel_rows(int8_prefill) if self.packed else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_rows, in_features]
        if self.packed and x.shape[0] <= self.max_kernel_rows:
            out = cpu_packed_q4_linear.linear(x.contiguous(), self.blocks, self.block_type)
            if out is not None:
                return out if self.bias is None else out + self.bias
        if x.is_cuda and self.block_type not in kquant_reference.K_BLOCK_TYPES:
            from pdserve.kernels import triton_block_linear

            out = triton_block_linear.block_linear(x, self.blocks, self.block_type, out_dtype=x.dtype)
            return out if self.bias is None else out + self.bias
        if x.is_cpu and x.shape[0] <= MAX_BLOCK_KERNEL_ROWS.get(x.dtype, 0):
            out = _cpu_kernel(self.block_type).block_linear(x, self.blocks, self.block_type)
            if out is not None:
                return out if self.bias is None else out + self.bias
        return F.linear(x, self.dequantized(x.dtype), self.bias)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out_features, in_features] in `dtype`, valid until the next call on this
        thread: it is written into one buffer that every layer shares (a fresh tensor a call costs
        more in page faults than the dequantizing)."""
        numel = self.out_features * self.in_features
        weight = _scratch(numel, dtype, self.blocks.device).view(self.out_features, self.in_features)
        if self.packed:
            return self._dequantized_packed(weight)
        if self.blocks.is_cuda and self.block_type not in kquant_reference.K_BLOCK_TYPES:
            from pdserve.kernels import triton_block_linear

            triton_block_linear.dequantize(self.blocks, self.block_type, dtype, out=weight)
            return weight
        if self.blocks.is_cpu and _cpu_kernel(self.block_type).dequantize(self.blocks, self.block_type, dtype,
                                                                          out=weight) is not None:
            return weight
        weight.copy_(block_reference(self.block_type).dequantize_reference(self.blocks, self.block_type))
        return weight

    def _dequantized_packed(self, weight: torch.Tensor) -> torch.Tensor:
        """`dequantized` of a packed weight: unpacked into this thread's byte buffer, then dequantized."""
        row_bytes = self.in_features // block_quant_reference.WEIGHTS_PER_BLOCK * \
            block_quant_reference.BLOCK_TYPES[self.block_type].block_bytes
        stored = _scratch(self.out_features * row_bytes, torch.uint8, self.blocks.device).view(-1, row_bytes)
        if (cpu_packed_q4_linear.unpack(self.blocks, self.block_type, out=stored) is None
                or cpu_block_linear.dequantize(stored, self.block_type, weight.dtype, out=weight) is None):
            raise RuntimeError("a packed weight's kernels are gone")  # packed only where they load
        return weight

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, block_type={self.block_type}"
                + (", packed for int8 activations" if self.packed else ""))


def block_reference(block_type: str):
    """The torch reference module of `block_type`: the K-quants' or the 32-weight blocks'."""
    return kquant_reference if block_type in kquant_reference.K_BLOCK_TYPES else block_quant_reference


def _cpu_kernel(block_type: str):
    """The compiled CPU kernel module of `block_type` (block_linear, dequantize; None when it
    cannot serve)."""
    return cpu_kquant_linear if block_type in kquant_reference.K_BLOCK_TYPES else cpu_block_linear


_buffers = threading.local()


def _scratch(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """This thread's buffer of `dtype` on `device`, grown to hold `numel` elements: [numel]. On
    CUDA, kernels run in the order of their stream, so the next write into it follows every read
    of what was written before."""
    buffers = vars(_buffers)
    buffer = buffers.get((dtype, device))
    if buffer is None or buffer.numel() < numel:
        buffer = buffers[(dtype, device)] = torch.empty(numel, dtype=dtype, device=device)
    return buffer[:numel]


def serve_blocks_as_stored(model: nn.Module, blocks: dict[str, tuple[str, torch.Tensor]], device: torch.device,
                           int8_activations: bool = False, int8_prefill: bool = False) -> int:
    """Replaces, in place, each `nn.Linear` of `model` whose checkpoint weights are all in
    `blocks` (name -> (block type, uint8 blocks)), of one type, by a `BlockLinear` over them on
    `device`, their rows stacked in the order the layer loads them; the layer's own weight may be
    a meta tensor, never read. With `int8_activations` the layers pack their Q4 weights for the
    int8 kernel, but for blocks another name shares (a tied head's), which would be held twice;
    with `int8_prefill` too, that kernel serves their prefills where faster.
    Returns how many layers were replaced."""
    block_types = {name: block_type for name, (block_type, _) in blocks.items()}
    holders = Counter(tensor.data_ptr() for _, tensor in blocks.values())

    def build(layer: nn.Linear, names: list[str]) -> BlockLinear | None:
        block_type = one_block_type(names, block_types)
        if block_type is None:
            return None
        parts = [blocks[name][1] for name in names]
        stacked = parts[0] if len(parts) == 1 else torch.cat(parts)
        shared = len(parts) == 1 and holders[parts[0].data_ptr()] > 1
        stacked = stacked.to(device)  # one source stays the tensor given: a tied head shares it
        return BlockLinear(stacked, block_type, layer.in_features, layer.bias, int8_activations and not shared,
                           int8_prefill)

    return replace_linear_layers(model, build)


def one_block_type(names: list[str], block_types: Mapping[str, str]) -> str | None:
    """The block type of the checkpoint weights `names` when `block_types` (name -> block type)
    holds them all, of one type: then serve_blocks_as_stored serves their layer. Else None."""
    types = {block_types.get(name) for name in names}
    return next(iter(types)) if len(types) == 1 else None
