"""Ahead-of-time compile of every Triton kernel for sm_90, so compiler-only errors show on a CPU.

Run as `python -m kernels.aot` with TRITON_INTERPRET unset or 0 (under the interpreter
`@triton.jit` yields interpreted functions that cannot be compiled). Each attention kernel is
compiled for fp16 and bf16 at head dims 64, 80 and 128, for fp32 (IEEE tile products) at head dim
64, and masked (Gemma 2's sliding window and logit softcap) for bf16 at head dim 128, with the
launchers' own constexpr choices, and over an int8 KV pool (kernels/kv_quant.py) for fp32 at head
dim 64, fp16 at 80 and bf16 at 128. The block-linear kernels are compiled for each GGUF block
type, for fp32 (IEEE tile products) and bf16 (tensor cores) with their default tiles,
block_linear's at the least row tile (decode) and the largest. One line per compile reports the PTX target and
cubin size, and the exit status is non-zero if any is empty.
"""
import sys

import triton
from triton.backends.compiler import GPUTarget

from pdserve.kernels import triton_block_linear, triton_decode_attention, triton_prefill_attention, triton_store_kv
from pdserve.kernels.block_quant_reference import BLOCK_TYPES

TARGET = GPUTarget("cuda", 90, 32)
COMPILE_CASES = (  # (dtype, head_dim, masked, int8_pool)
    *((dtype, head_dim, False, False) for dtype in ("fp16", "bf16") for head_dim in (64, 80, 128)),
    ("fp32", 64, False, False),
    ("bf16", 128, True, False),
    ("fp32", 64, False, True),
    ("fp16", 80, False, True),
    ("bf16", 128, False, True),
)
MASKED_WINDOW, MASKED_SOFTCAP = 4096, 50.0  # Gemma 2's
FLOAT_ARGS = {"qk_scale_log2"}
NUM_KV_HEADS = 8
QUERIES_PER_KV = 4
BLOCK_SIZE = 16
NUM_WARPS = 4
BLOCK_LINEAR_DTYPES = ("fp32", "bf16")
BLOCK_LINEAR_ROW_TILES = (triton_block_linear.MIN_TILE, triton_block_linear.MAX_ROW_TILE)


def kernel_specs(dtype: str, head_dim: int, masked: bool, int8_pool: bool):
    """(kernel, pointer types, constexprs) for one dtype and head dim, masked or not, over a pool of
    `dtype` or int8."""
    caches = dict.fromkeys(("k_cache_ptr", "v_cache_ptr"), "i8" if int8_pool else dtype)
    paging = {**caches, "block_tables_ptr": "i32"}
    exact_dot = dtype == "fp32"
    window, softcap = (MASKED_WINDOW, MASKED_SOFTCAP) if masked else (None, None)
    split_tokens = triton_decode_attention.default_split_tokens(4096)
    num_splits = triton.cdiv(4096, split_tokens)
    yield (
        triton_store_kv._store_kv_kernel,
        {**caches, "key_ptr": dtype, "value_ptr": dtype, "slot_mapping_ptr": "i64"},
        triton_store_kv.store_kv_constants(NUM_KV_HEADS, head_dim),
    )
    yield (
        triton_decode_attention._decode_split_kernel,
        {**paging, "query_ptr": dtype, "context_lens_ptr": "i32", "partial_out_ptr": "fp32",
         "partial_lse_ptr": "fp32"},
        triton_decode_attention.split_kernel_constants(
            head_dim, QUERIES_PER_KV, BLOCK_SIZE, split_tokens, exact_dot, sliding_window=window, logit_softcap=softcap
        ),
    )
    yield (
        triton_decode_attention._decode_reduce_kernel,
        {"partial_out_ptr": "fp32", "partial_lse_ptr": "fp32", "context_lens_ptr": "i32",
         "out_ptr": dtype},
        triton_decode_attention.reduce_kernel_constants(head_dim, num_splits, window),
    )
    yield (
        triton_prefill_attention._prefill_kernel,
        {**paging, "query_ptr": dtype, "out_ptr": dtype, "query_start_loc_ptr": "i32",
         "context_lens_ptr": "i32"},
        triton_prefill_attention.prefill_kernel_constants(
            head_dim, QUERIES_PER_KV, BLOCK_SIZE, query_tile=64, key_tile=64, exact_dot=exact_dot,
            sliding_window=window, logit_softcap=softcap,
        ),
    )


def block_kernel_specs(block_type: str, dtype: str, row_tile: int | None):
    """[(kernel, pointer types, constexprs)] for one block type, x or the dequantized weight in
    `dtype`: block_linear's with rows of x in tiles of `row_tile`, dequantize's for None."""
    tiles = triton_block_linear.Tiles()
    layout = dict(BLOCK_TYPE=block_type, BLOCK_BYTES=BLOCK_TYPES[block_type].block_bytes,
                  FEATURE_TILE=tiles.features, K_TILE=tiles.k)
    if row_tile is None:
        return [(triton_block_linear._dequantize_kernel, {"blocks_ptr": "u8", "out_ptr": dtype}, layout)]
    return [(triton_block_linear._block_linear_kernel, {"x_ptr": dtype, "blocks_ptr": "u8", "out_ptr": dtype},
             {**layout, "ROW_TILE": row_tile, "EXACT_DOT": dtype == "fp32"})]


def signature(kernel, pointer_types: dict, constants: dict) -> dict:
    def arg_type(name):
        if name in constants:
            return "constexpr"
        if name.endswith("_ptr"):
            return "*" + pointer_types[name]
        return "fp32" if name in FLOAT_ARGS else "i32"

    return {name: arg_type(name) for name in kernel.arg_names}


def main() -> int:
    if not isinstance(triton_store_kv._store_kv_kernel, triton.runtime.JITFunction):
        print("TRITON_INTERPRET is set: kernels are interpreted and cannot be compiled")
        return 1
    cases = [(f"{dtype} d{head_dim}{' masked' if masked else ''}{' int8_pool' if int8_pool else ''}",
               kernel_specs(dtype, head_dim, masked, int8_pool))
             for dtype, head_dim, masked, int8_pool in COMPILE_CASES]
    cases += [(f"{dtype} {block_type}{f' rows{row_tile}' if row_tile else ''}",
               block_kernel_specs(block_type, dtype, row_tile))
              for block_type in BLOCK_TYPES for dtype in BLOCK_LINEAR_DTYPES
              for row_tile in (*BLOCK_LINEAR_ROW_TILES, None)]
    num_empty = 0
    for case, specs in cases:
        for kernel, pointer_types, constants in specs:
            source = triton.compiler.ASTSource(
                kernel, signature(kernel, pointer_types, constants), constants
            )
            compiled = triton.compile(source, target=TARGET, options={"num_warps": NUM_WARPS})
            cubin_bytes = len(compiled.asm["cubin"])
            target_line = next(
                line for line in compiled.asm["ptx"].splitlines() if line.startswith(".target")
            )
            num_empty += cubin_bytes == 0
            print(f"{kernel.__name__} {case}: {target_line}, cubin {cubin_bytes} bytes")
    return 1 if num_empty else 0


if __name__ == "__main__":
    sys.exit(main())
