"""GGUF's K-quant weight formats Q4_K and Q6_K, in plain torch: the specification that the compiled
CPU kernel (`csrc/kquant_linear.c`, through `cpu_kquant_linear`) is held to. The functions are
named as block_quant_reference's, so a caller picks the module by block type.

A weight [out_features N, in_features K], K a multiple of 256, is stored as uint8
[N, (K / 256) * block_bytes]: each row its super-blocks of 256 consecutive weights back to back,
little-endian, as ggml lays them out:

    q4_k  144 bytes: fp16 d, fp16 dmin, uint8 scales[12], uint8 qs[128]
          8 sub-blocks j of 32 weights, each a 6-bit scale sc[j] and a 6-bit min m[j]:
              j < 4:  sc = scales[j] & 63,  m = scales[j + 4] & 63
              j >= 4: sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4),
                      m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)
          weight 64 g + i (i < 32) is the low nibble of qs[32 g + i], sub-block 2 g;
          weight 64 g + 32 + i its high nibble, sub-block 2 g + 1:
              w = (d * sc) * q - dmin * m
    q6_k  210 bytes: uint8 ql[128], uint8 qh[64], int8 scales[16], fp16 d
          weight 128 h + 32 t + i (h < 2, t < 4, i < 32) has 6 bits q: the low 4 are nibble t / 2
          of ql[64 h + 32 (t % 2) + i], the high 2 are bits 2 t, 2 t + 1 of qh[32 h + i];
          16 sub-blocks of 16 weights, each its scale:
              w = (d * scales[w / 16]) * (q - 32)

Invariant: `dequantize_reference` equals `gguf.quants.dequantize` bit for bit. In float32 every
product above is exact (fp16 d's 11 significant bits times at most 6 bits of scale and 4 of q for
Q4_K, 7 and 5 for Q6_K), so only Q4_K's subtraction rounds, once: the order of the products, or a
fused multiply-subtract, gives the same float32. Every weight is a multiple of 2^-24 (fp16's
least step), so none is a float32 subnormal.
"""
from __future__ import annotations

import torch

from pdserve.kernels.block_quant_reference import BlockType, block_type_of, halves, row_in_features

WEIGHTS_PER_SUPER_BLOCK = 256
K_BLOCK_TYPES = {
    "q4_k": BlockType("q4_k", ggml_type=12, block_bytes=144, weights_per_block=WEIGHTS_PER_SUPER_BLOCK),
    "q6_k": BlockType("q6_k", ggml_type=14, block_bytes=210, weights_per_block=WEIGHTS_PER_SUPER_BLOCK),
}


def in_features_of(blocks: torch.Tensor, block_type: str) -> int:
    """K of a uint8 [N, (K / 256) * block_bytes] weight; ValueError when the shape cannot be one."""
    return row_in_features(blocks, block_type_of(block_type, K_BLOCK_TYPES))


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 144] -> float32 [n, 256]."""
    d, dmin = halves(blocks[:, 0:2]), halves(blocks[:, 2:4])
    low, mid, high = blocks[:, 4:16].reshape(-1, 3, 4).unbind(1)  # scales[0:4], [4:8], [8:12]
    sc = torch.cat([low & 63, (high & 15) | ((low >> 2) & 48)], dim=1)  # [n, 8]
    m = torch.cat([mid & 63, (high >> 4) | ((mid >> 2) & 48)], dim=1)  # [n, 8]
    qs = blocks[:, 16:].reshape(-1, 4, 32)
    q = torch.stack([qs & 15, qs >> 4], dim=2).reshape(-1, 8, 32).float()  # [n, sub-block, 32]
    return ((d * sc.float())[..., None] * q - (dmin * m.float())[..., None]).reshape(-1, WEIGHTS_PER_SUPER_BLOCK)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 210] -> float32 [n, 256]."""
    ql, qh = blocks[:, :128].reshape(-1, 2, 64), blocks[:, 128:192].reshape(-1, 2, 32)
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()  # [n, 16]
    d = halves(blocks[:, 208:210])
    # [n, 8, 32]: row 4 h + t holds weights 128 h + 32 t + (0..31)
    low = torch.stack([ql & 15, ql >> 4], dim=2).reshape(-1, 8, 32)
    high = torch.stack([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], dim=2).reshape(-1, 8, 32)
    q = ((low | (high << 4)).float() - 32).reshape(-1, 16, 16)  # [n, sub-block, 16]
    return ((d * scales)[..., None] * q).reshape(-1, WEIGHTS_PER_SUPER_BLOCK)


def dequantize_reference(blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    """uint8 [N, num_super_blocks * block_bytes] -> float32 [N, num_super_blocks * 256]."""
    in_features = in_features_of(blocks, block_type)
    kind = K_BLOCK_TYPES[block_type]
    super_blocks = blocks.reshape(-1, kind.block_bytes)
    w = _q4_k(super_blocks) if block_type == "q4_k" else _q6_k(super_blocks)
    return w.reshape(blocks.shape[0], in_features)


def block_linear_reference(x: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    """x [M, K] times the dequantized weight [N, K], transposed: [M, N] in x.dtype (float32 math)."""
    w = dequantize_reference(blocks, block_type)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} features, the {block_type} weight {w.shape[1]}")
    return (x.float() @ w.T).to(x.dtype)
