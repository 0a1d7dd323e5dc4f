"""GGUF's block-quantized weight formats Q8_0, Q4_0 and Q4_1, in plain torch: the specification
that the compiled CPU kernel (`csrc/block_linear.c`, through `cpu_block_linear`) is held to.

A weight [out_features N, in_features K] is stored as uint8 [N, (K / 32) * block_bytes]: each row
(an output feature, as a .gguf file orders them) is its K / 32 blocks back to back. A block holds
32 consecutive weights of the row, little-endian, as ggml lays it out:

    q8_0  34 bytes: fp16 d, int8 qs[32]         w[i] = d * qs[i]
    q4_0  18 bytes: fp16 d, uint8 qs[16]        w[i] = d * ((qs[i] & 0xF) - 8),  i < 16
                                                w[i + 16] = d * ((qs[i] >> 4) - 8)
    q4_1  20 bytes: fp16 d, fp16 m, uint8 qs[16] w[i] = d * (qs[i] & 0xF) + m,  i < 16
                                                w[i + 16] = d * (qs[i] >> 4) + m

Invariant: `dequantize_reference` equals `gguf.quants.dequantize` bit for bit (float32: d and m
widened exactly; d * q is exact, an 11-bit significand times at most 8 bits, so only q4_1's + m
rounds, and a fused multiply-add would give the same), and `quantize_reference` equals
`gguf.quants.quantize`, itself ggml's round-to-nearest reference quantizers (Q8_0 rounds half
away from zero; Q4_0 scales by the signed value of largest magnitude over -8; Q4_1 spans the
block's min to max in 15 steps).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

WEIGHTS_PER_BLOCK = 32


@dataclass(frozen=True)
class BlockType:
    name: str
    ggml_type: int  # GGMLQuantizationType's value, which the C kernel takes as block_type
    block_bytes: int
    weights_per_block: int = WEIGHTS_PER_BLOCK


BLOCK_TYPES = {
    "q8_0": BlockType("q8_0", ggml_type=8, block_bytes=34),
    "q4_0": BlockType("q4_0", ggml_type=2, block_bytes=18),
    "q4_1": BlockType("q4_1", ggml_type=3, block_bytes=20),
}


def block_type_of(name: str, block_types: dict[str, BlockType] = BLOCK_TYPES) -> BlockType:
    if name not in block_types:
        raise ValueError(f"unknown block type {name!r}: expected one of {sorted(block_types)}")
    return block_types[name]


def in_features_of(blocks: torch.Tensor, block_type: str) -> int:
    """K of a uint8 [N, (K / 32) * block_bytes] weight; ValueError when the shape cannot be one."""
    return row_in_features(blocks, block_type_of(block_type))


def row_in_features(blocks: torch.Tensor, kind: BlockType) -> int:
    """K of a uint8 [N, (K / weights_per_block) * block_bytes] weight of `kind`; ValueError when
    the shape cannot be one."""
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] % kind.block_bytes:
        raise ValueError(f"{kind.name} blocks must be uint8 [N, num_blocks * {kind.block_bytes}], "
                         f"got {blocks.dtype} {list(blocks.shape)}")
    return blocks.shape[1] // kind.block_bytes * kind.weights_per_block


def halves(fields: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 2] little-endian fp16 bit patterns -> float32 [..., 1], widened exactly."""
    return fields.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 16] -> uint8 [..., 32]: the 16 low nibbles, then the 16 high ones."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def dequantize_reference(blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    """uint8 [N, num_blocks * block_bytes] -> float32 [N, num_blocks * 32]."""
    in_features = in_features_of(blocks, block_type)
    kind = BLOCK_TYPES[block_type]
    rows = blocks.reshape(blocks.shape[0], -1, kind.block_bytes)  # [N, num_blocks, block_bytes]
    d = halves(rows[..., 0:2])
    if block_type == "q8_0":
        w = rows[..., 2:].contiguous().view(torch.int8).float() * d
    elif block_type == "q4_0":
        w = d * (_nibbles(rows[..., 2:]).to(torch.int8) - 8).float()
    else:
        w = d * _nibbles(rows[..., 4:]).float() + halves(rows[..., 2:4])
    return w.reshape(blocks.shape[0], in_features)


def block_linear_reference(x: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    """x [M, K] times the dequantized weight [N, K], transposed: [M, N] in x.dtype (float32 math)."""
    w = dequantize_reference(blocks, block_type)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} features, the {block_type} weight {w.shape[1]}")
    return (x.float() @ w.T).to(x.dtype)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """roundf, as gguf's np_roundf computes it (floor of |x| plus its doubled fraction's floor)."""
    a = x.abs()
    floored = a.floor()
    return x.sign() * (floored + (2 * (a - floored)).floor())


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 32] of values 0..15 -> uint8 [n, 16]: weight i in the low nibble of byte i,
    weight i + 16 in its high nibble."""
    return q[:, :16] | (q[:, 16:] << 4)


def _half_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).view(torch.uint8)  # [n, 1] -> [n, 2], little-endian


def quantize_reference(weight: torch.Tensor, block_type: str) -> torch.Tensor:
    """float32 [N, K], K a multiple of 32 -> uint8 [N, (K / 32) * block_bytes], as gguf quantizes."""
    block_type_of(block_type)  # a known type, or ValueError
    if weight.dim() != 2 or weight.shape[1] % WEIGHTS_PER_BLOCK:
        raise ValueError(f"quantizing needs a weight [N, K] with K a multiple of 32, got {list(weight.shape)}")
    blocks = weight.float().reshape(-1, WEIGHTS_PER_BLOCK)
    if block_type == "q8_0":
        d = blocks.abs().amax(dim=-1, keepdim=True) / 127
        q = _round_half_away(blocks * _inverse(d)).to(torch.int8).view(torch.uint8)
        packed = torch.cat([_half_bytes(d), q], dim=-1)
    elif block_type == "q4_0":
        signed_max = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True))
        d = signed_max / -8
        q = torch.trunc(blocks * _inverse(d) + 8.5).to(torch.uint8).clamp(0, 15)
        packed = torch.cat([_half_bytes(d), _pack_nibbles(q)], dim=-1)
    else:
        low, high = blocks.amin(dim=-1, keepdim=True), blocks.amax(dim=-1, keepdim=True)
        d = (high - low) / 15
        q = torch.trunc((blocks - low) * _inverse(d) + 0.5).to(torch.uint8).clamp(0, 15)
        packed = torch.cat([_half_bytes(d), _half_bytes(low), _pack_nibbles(q)], dim=-1)
    return packed.reshape(weight.shape[0], -1)
