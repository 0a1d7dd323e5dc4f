"""Loading one tile of a GGUF block-quantized weight (Q8_0, Q4_0, Q4_1), dequantized in registers;
shared by the Triton block-linear kernels (kernels/triton_block_linear.py).

The layout is kernels/block_quant_reference.py's: weight row n (an output feature) is its K / 32
blocks back to back, so block b of row n starts at byte n * stride_blocks_feature + b *
BLOCK_BYTES and holds the row's weights 32 * b .. 32 * b + 31. A tile is FEATURE_TILE rows by
K_TILE weights from k_start, a multiple of 32: whole blocks, K_TILE / 32 of each row. It is built
as [FEATURE_TILE, K_TILE / 32, 32], each block's fp16 scale d (and Q4_1's minimum m) read once
as two little-endian bytes (a block's fields have no alignment to rely on), then flattened.

Every weight is gguf's float32 dequantization bit for bit: d * q is exact in float32 (an 11-bit
significand times at most 8 bits), so only Q4_1's + m rounds, once, fused multiply-add or not.
Rows outside `feature_mask` and blocks past `in_features` come back as zeros.
"""
import triton
import triton.language as tl

WEIGHTS_PER_BLOCK = tl.constexpr(32)
NIBBLE_BYTES = tl.constexpr(16)  # a Q4 block's qs: byte i holds weight i (low nibble) and i + 16 (high)


@triton.jit
def _half(byte_ptrs, mask):
    """The fp16 whose little-endian bytes start at `byte_ptrs`, widened (exactly) to float32."""
    low = tl.load(byte_ptrs, mask=mask, other=0).to(tl.uint16)
    high = tl.load(byte_ptrs + 1, mask=mask, other=0).to(tl.uint16)
    return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibbles(qs_ptrs, lanes, mask):
    """Weight `lanes`' 4-bit values 0..15, from the 16 bytes at `qs_ptrs`."""
    qs = tl.load(qs_ptrs + lanes % NIBBLE_BYTES, mask=mask, other=0)
    return (qs >> (lanes // NIBBLE_BYTES * 4)) & 0xF


@triton.jit
def load_weight_tile(blocks_ptr, features, feature_mask, k_start, in_features, stride_blocks_feature,
                     BLOCK_TYPE: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                     FEATURE_TILE: tl.constexpr, K_TILE: tl.constexpr):
    """Weights k_start .. k_start + K_TILE - 1 of rows `features` ([FEATURE_TILE]): float32
    [FEATURE_TILE, K_TILE]."""
    BLOCKS_PER_TILE: tl.constexpr = K_TILE // WEIGHTS_PER_BLOCK
    block_ids = k_start // WEIGHTS_PER_BLOCK + tl.arange(0, BLOCKS_PER_TILE)  # [BLOCKS_PER_TILE]
    in_weight = block_ids * WEIGHTS_PER_BLOCK < in_features
    block_mask = feature_mask[:, None] & in_weight[None, :]  # [FEATURE_TILE, BLOCKS_PER_TILE]
    block_ptrs = (blocks_ptr + features[:, None].to(tl.int64) * stride_blocks_feature
                  + block_ids[None, :] * BLOCK_BYTES)  # [FEATURE_TILE, BLOCKS_PER_TILE]
    d = _half(block_ptrs, block_mask)[:, :, None]  # [FEATURE_TILE, BLOCKS_PER_TILE, 1]
    lanes = tl.arange(0, WEIGHTS_PER_BLOCK)[None, None, :]  # a weight's place in its block
    ptrs, mask = block_ptrs[:, :, None], block_mask[:, :, None]
    if BLOCK_TYPE == "q8_0":
        qs = tl.load(ptrs + 2 + lanes, mask=mask, other=0)
        w = d * qs.to(tl.int8, bitcast=True).to(tl.float32)
    elif BLOCK_TYPE == "q4_0":
        w = d * (_nibbles(ptrs + 2, lanes, mask).to(tl.float32) - 8)
    else:
        m = _half(block_ptrs + 2, block_mask)[:, :, None]
        w = d * _nibbles(ptrs + 4, lanes, mask).to(tl.float32) + m
    return tl.reshape(w, (FEATURE_TILE, K_TILE))  # [FEATURE_TILE, BLOCKS_PER_TILE * 32]
