"""Every Triton kernel compiles ahead of time for sm_90 (ptxas ships with Triton; no GPU needed):
the attention kernels for every case of aot.COMPILE_CASES (int8 KV pools among them), the
block-linear kernels for every block type and x dtype, block_linear at each row tile of
aot.BLOCK_LINEAR_ROW_TILES.

The interpreter flag set for the other tests turns kernels into interpreted functions, so the
compile runs `python -m kernels.aot` in a fresh process with TRITON_INTERPRET=0.
"""
import os
import re
import subprocess
import sys

import pytest

from pdserve.kernels import aot
from pdserve.kernels.block_quant_reference import BLOCK_TYPES

KERNEL_NAMES = (
    "_store_kv_kernel",
    "_decode_split_kernel",
    "_decode_reduce_kernel",
    "_prefill_kernel",
)
COMPILED_LINE = re.compile(r"^(\w+) (\w+) d(\d+)( masked)?( int8_pool)?: \.target sm_90a?, cubin (\d+) bytes$", re.M)
BLOCK_COMPILED_LINE = re.compile(r"^(\w+) (\w+) (q\d_\d)(?: rows(\d+))?: \.target sm_90a?, cubin (\d+) bytes$", re.M)

pytestmark = pytest.mark.packaging  # generated code, and about 40 s of compiling: not the fast tier


def test_every_kernel_compiles_to_a_cubin_for_sm_90():
    result = subprocess.run(
        [sys.executable, "-m", "pdserve.kernels.aot"],
        env={**os.environ, "TRITON_INTERPRET": "0"},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # [(kernel, dtype, head_dim, " masked" or "", " int8_pool" or "", cubin_bytes)]
    compiled = COMPILED_LINE.findall(result.stdout)
    expected = {
        (name, dtype, str(head_dim), " masked" if masked else "", " int8_pool" if int8_pool else "")
        for name in KERNEL_NAMES
        for dtype, head_dim, masked, int8_pool in aot.COMPILE_CASES
    }
    assert {tuple(case) for *case, _ in compiled} == expected
    assert all(int(cubin_bytes) > 0 for *_, cubin_bytes in compiled)

    block_compiled = BLOCK_COMPILED_LINE.findall(result.stdout)  # [(kernel, dtype, block type, row tile or "", bytes)]
    block_expected = {
        (name, dtype, block_type, row_tile)
        for block_type in BLOCK_TYPES
        for dtype in aot.BLOCK_LINEAR_DTYPES
        for name, row_tile in (*(("_block_linear_kernel", str(tile)) for tile in aot.BLOCK_LINEAR_ROW_TILES),
                               ("_dequantize_kernel", ""))
    }
    assert {(name, dtype, block_type, tile) for name, dtype, block_type, tile, _ in block_compiled} == block_expected
    assert all(int(cubin_bytes) > 0 for *_, cubin_bytes in block_compiled)
