"""Linear layers on GGUF block-quantized weights (Q8_0, Q4_0, Q4_1) in Triton, for CUDA: the
layouts and the exact dequantization are kernels/block_quant_reference.py's, a weight [N, K]
stored as uint8 [N, (K / 32) * block_bytes], each row its blocks back to back.

`block_linear(x, blocks, block_type)` multiplies x [M, K] by the weight without writing it out:
one program per (tile of `Tiles.rows` rows of x, tile of `Tiles.features` output features) walks
K in steps of `Tiles.k` (a multiple of 32, so whole blocks), reads each of its blocks' bytes once,
unpacks them in registers (kernels/block_quant_tile.py) and accumulates W_tile @ x_tile.T in
float32. The weight is the dot's left operand, so the output features fill the tensor cores'
rows even when a decode step has one row of x; the accumulator is the output transposed. The
same kernel serves a decode step (one row tile) and a prefill chunk (many).
`dequantize(blocks, block_type, dtype)` writes the whole weight, one program per tile.

Invariant: `dequantize` equals `dequantize_reference(blocks, block_type).to(dtype)` bit for bit
(round to nearest even). `block_linear` equals x.float() @ dequantize_reference(...).T but for
float32 summation order where its tiles are multiplied in float32: always under the interpreter,
and for float32 x on a GPU (IEEE products, not TF32). On a GPU, bfloat16 and float16 x go to the
tensor cores with the weight rounded to x's dtype, what a model in that dtype multiplies by (as
`dequantize(..., x.dtype)` rounds it); the sum stays float32.

The default tiles are unmeasured: 64 features by 64 weights of K, and x's rows rounded up to a
power of 2 between 16 (tl.dot's least tile side) and 64. Arguments the reference rejects raise
ValueError as it does (an unknown block type, blocks whose width is no whole number of blocks,
x whose width is not the weight's); so do an x dtype other than float32, bfloat16 and float16
and tiles that are not powers of 2 of at least 16 (for K, 32: a whole block).
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pdserve.kernels.block_quant_reference import BLOCK_TYPES, WEIGHTS_PER_BLOCK, in_features_of
from pdserve.kernels.block_quant_tile import load_weight_tile
from pdserve.kernels.tile_dot import needs_exact_dot, tile_dot

MIN_TILE = 16  # tl.dot needs every tile side >= 16
MAX_ROW_TILE = 64
ROW_TILES = tuple(2**i for i in range(MIN_TILE.bit_length() - 1, MAX_ROW_TILE.bit_length()))  # what Tiles.rows_for picks
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True, slots=True)
class Tiles:
    rows: int | None = None  # None: x's rows rounded up to a power of 2 in [MIN_TILE, MAX_ROW_TILE]
    features: int = 64
    k: int = 64
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name, least in (("rows", MIN_TILE), ("features", MIN_TILE), ("k", WEIGHTS_PER_BLOCK)):
            tile = getattr(self, name)
            if tile is not None and (tile < least or tile & (tile - 1)):
                raise ValueError(f"a tile of {name} must be a power of 2 >= {least}, got {tile}")

    def rows_for(self, num_rows: int) -> int:
        return self.rows or min(MAX_ROW_TILE, max(MIN_TILE, triton.next_power_of_2(num_rows)))


@triton.jit
def _rounded(value, dtype: tl.constexpr):
    """float32 `value` in `dtype`, rounded to nearest even as torch rounds. Bfloat16 is rounded
    on the bits, since the interpreter's cast to it truncates; a NaN stays a NaN, quieted."""
    if dtype == tl.bfloat16:
        bits = value.to(tl.uint32, bitcast=True)
        nearest_even = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded_bits = tl.where(value == value, nearest_even, (bits >> 16) | 0x40)
        rounded = rounded_bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        rounded = value.to(dtype)
    return rounded


@triton.jit(do_not_specialize=["num_rows"])  # one compile serves every batch size of a row tile
def _block_linear_kernel(
    x_ptr,
    blocks_ptr,
    out_ptr,
    num_rows,
    num_features,
    in_features,
    stride_x_row,
    stride_x_k,
    stride_blocks_feature,
    stride_out_row,
    stride_out_feature,
    BLOCK_TYPE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    ROW_TILE: tl.constexpr,
    FEATURE_TILE: tl.constexpr,
    K_TILE: tl.constexpr,
    EXACT_DOT: tl.constexpr,
):
    rows = tl.program_id(0) * ROW_TILE + tl.arange(0, ROW_TILE)  # [ROW_TILE]
    features = tl.program_id(1) * FEATURE_TILE + tl.arange(0, FEATURE_TILE)  # [FEATURE_TILE]
    row_mask = rows < num_rows
    feature_mask = features < num_features
    x_row_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_x_row  # [ROW_TILE, 1]

    acc = tl.zeros([FEATURE_TILE, ROW_TILE], tl.float32)  # the output tile, transposed
    for k_start in range(0, in_features, K_TILE):
        ks = k_start + tl.arange(0, K_TILE)  # [K_TILE]
        x = tl.load(x_row_ptrs + ks[None, :] * stride_x_k, mask=row_mask[:, None] & (ks < in_features)[None, :],
                    other=0.0)  # [ROW_TILE, K_TILE]
        w = load_weight_tile(blocks_ptr, features, feature_mask, k_start, in_features, stride_blocks_feature,
                             BLOCK_TYPE, BLOCK_BYTES, FEATURE_TILE, K_TILE)  # [FEATURE_TILE, K_TILE] float32
        acc += tile_dot(w, tl.trans(x), EXACT_DOT)

    out_offsets = rows[None, :].to(tl.int64) * stride_out_row + features[:, None] * stride_out_feature
    out_mask = feature_mask[:, None] & row_mask[None, :]
    tl.store(out_ptr + out_offsets, _rounded(acc, out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _dequantize_kernel(
    blocks_ptr,
    out_ptr,
    num_features,
    in_features,
    stride_blocks_feature,
    stride_out_feature,
    stride_out_k,
    BLOCK_TYPE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    FEATURE_TILE: tl.constexpr,
    K_TILE: tl.constexpr,
):
    features = tl.program_id(0) * FEATURE_TILE + tl.arange(0, FEATURE_TILE)  # [FEATURE_TILE]
    k_start = tl.program_id(1) * K_TILE
    ks = k_start + tl.arange(0, K_TILE)  # [K_TILE]
    feature_mask = features < num_features
    w = load_weight_tile(blocks_ptr, features, feature_mask, k_start, in_features, stride_blocks_feature,
                         BLOCK_TYPE, BLOCK_BYTES, FEATURE_TILE, K_TILE)  # [FEATURE_TILE, K_TILE] float32
    out_offsets = features[:, None].to(tl.int64) * stride_out_feature + ks[None, :] * stride_out_k
    tl.store(out_ptr + out_offsets, _rounded(w, out_ptr.dtype.element_ty),
             mask=feature_mask[:, None] & (ks < in_features)[None, :])


def _checked_in_features(blocks: torch.Tensor, block_type: str) -> int:
    in_features = in_features_of(blocks, block_type)
    if blocks.numel() and blocks.stride(1) != 1:
        raise ValueError(f"a row of {block_type} blocks must be contiguous bytes, got strides {blocks.stride()}")
    return in_features


def _check_dtype(dtype: torch.dtype, what: str) -> None:
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{what} must be float32, bfloat16 or float16, got {dtype}")


def block_linear(x: torch.Tensor, blocks: torch.Tensor, block_type: str, *, out_dtype: torch.dtype = torch.float32,
                 tiles: Tiles = Tiles()) -> torch.Tensor:
    """x [M, K] float32, bfloat16 or float16 times the weight [N, K] held as `blocks` (uint8
    [N, (K / 32) * block_bytes]), transposed: [M, N] in out_dtype, summed in float32."""
    in_features = _checked_in_features(blocks, block_type)
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"x {list(x.shape)} does not match a {block_type} weight of {in_features} in-features")
    _check_dtype(x.dtype, "x")
    _check_dtype(out_dtype, "the product")
    num_rows, num_features = x.shape[0], blocks.shape[0]
    out = torch.empty(num_rows, num_features, dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    row_tile = tiles.rows_for(num_rows)
    _block_linear_kernel[(triton.cdiv(num_rows, row_tile), triton.cdiv(num_features, tiles.features))](
        x,
        blocks,
        out,
        num_rows,
        num_features,
        in_features,
        x.stride(0),
        x.stride(1),
        blocks.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_TYPE=block_type,
        BLOCK_BYTES=BLOCK_TYPES[block_type].block_bytes,
        ROW_TILE=row_tile,
        FEATURE_TILE=tiles.features,
        K_TILE=tiles.k,
        EXACT_DOT=needs_exact_dot(x.dtype),
        num_warps=tiles.num_warps,
    )
    return out


def dequantize(blocks: torch.Tensor, block_type: str, dtype: torch.dtype = torch.float32, *,
               out: torch.Tensor | None = None, tiles: Tiles = Tiles()) -> torch.Tensor:
    """The weight [N, K] in dtype (float32, or bfloat16 or float16 rounded to nearest even) from
    `blocks`, written into `out` when given ([N, K] of dtype, any strides)."""
    in_features = _checked_in_features(blocks, block_type)
    _check_dtype(dtype, "the weight")
    num_features = blocks.shape[0]
    if out is None:
        out = torch.empty(num_features, in_features, dtype=dtype, device=blocks.device)
    elif out.shape != (num_features, in_features) or out.dtype != dtype:
        raise ValueError(f"out {out.dtype} {list(out.shape)} is not {dtype} {[num_features, in_features]}")
    if out.numel() == 0:
        return out
    _dequantize_kernel[(triton.cdiv(num_features, tiles.features), triton.cdiv(in_features, tiles.k))](
        blocks,
        out,
        num_features,
        in_features,
        blocks.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_TYPE=block_type,
        BLOCK_BYTES=BLOCK_TYPES[block_type].block_bytes,
        FEATURE_TILE=tiles.features,
        K_TILE=tiles.k,
        num_warps=tiles.num_warps,
    )
    return out
