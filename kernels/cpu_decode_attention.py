"""Compiled paged decode attention for CPU: `csrc/paged_decode_attention.c`, built on first use.

The C source is compiled with the system C compiler (`$CC`, else `cc`), once per KV dtype it
serves (`KV_DTYPE_FLAGS`: float32, and bfloat16 widened as it is read), into a shared library
cached under `$XDG_CACHE_HOME/pdserve/kernels` (`~/.cache/pdserve/kernels` when XDG_CACHE_HOME is
unset, beside the demo model), named by a hash of the source, the flags and the CPU model, so an
edit or another machine never reuses a stale build; concurrent first builds race harmlessly (each
writes a temporary file, then renames it in place).
The library is called through `ctypes`, which releases the GIL for the call.

`load(dtype)` returns None when the kernel cannot be had (no compiler, a failed build, an
unsupported dtype, or `PDSERVE_CPU_KERNELS=0`), and the caller keeps the torch reference: the
compiled kernel is an optimisation, never a requirement. The query and output cross the call in
float32 (a copy for bfloat16, small beside the context it reads).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_decode_attention.c"
CFLAGS = ("-O3", "-march=native", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", "-fopenmp",
          "-shared", "-fPIC", "-std=c11")
KV_DTYPE_FLAGS = {torch.float32: (), torch.bfloat16: ("-DKV_BFLOAT16",)}
BUILD_TIMEOUT_S = 120


@functools.cache
def load(dtype: torch.dtype = torch.float32) -> ctypes.CDLL | None:
    """The kernel for a pool of `dtype`, built on first use."""
    if os.environ.get("PDSERVE_CPU_KERNELS", "1") == "0" or dtype not in KV_DTYPE_FLAGS:
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        logger.warning("no C compiler found: CPU decode attention uses the torch reference")
        return None
    try:
        library = ctypes.CDLL(str(_build(compiler, CFLAGS + KV_DTYPE_FLAGS[dtype])))
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("building %s failed, CPU decode attention uses the torch reference: %s", SOURCE.name, exc)
        return None
    function = library.paged_decode_attention
    function.restype = ctypes.c_int64
    function.argtypes = ([ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7
                         + [ctypes.c_float, ctypes.c_int64, ctypes.c_float, ctypes.c_int32])
    return library


def _build(compiler: str, flags: tuple[str, ...]) -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), _cpu_model().encode()])).hexdigest()[:16]
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdserve" / "kernels"
    library_path = cache_dir / f"{SOURCE.stem}-{key}.so"
    if library_path.exists():
        return library_path
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache_dir, suffix=".so", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    try:
        subprocess.run([compiler, *flags, str(SOURCE), "-o", str(tmp_path), "-lm"],
                       check=True, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        os.replace(tmp_path, library_path)
    finally:
        tmp_path.unlink(missing_ok=True)
    logger.info("built %s", library_path)
    return library_path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()


def decode_attention(library: ctypes.CDLL, query, k_cache, v_cache, block_tables, context_lens, scale, *,
                     sliding_window: int | None = None, logit_softcap: float | None = None):
    """`kernels.decode_attention` for CPU tensors of the documented layouts, K/V in the dtype that
    `library` was built for. The C kernel takes 0 for no window and for no softcap."""
    query_f32 = query.float().contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    context_lens = context_lens.to(torch.int32).contiguous()
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads = k_cache.shape[:3]
    out = torch.empty_like(query_f32)  # [num_seqs, num_heads, head_dim]
    status = library.paged_decode_attention(
        out.data_ptr(), query_f32.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        block_tables.data_ptr(), context_lens.data_ptr(),
        num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, block_size, block_tables.shape[1],
        scale, sliding_window or 0, logit_softcap or 0.0, torch.get_num_threads(),
    )
    if status == -1:
        raise MemoryError(f"decode attention: no scratch memory for {num_seqs} sequences")
    if status:
        seq = status - 1
        raise ValueError(f"decode attention: sequence {seq} has context length {int(context_lens[seq])} "
                         f"or a block id outside the pool of {num_blocks} blocks")
    return out.to(query.dtype)
