"""Compiled paged decode attention for CPU: `csrc/paged_decode_attention.c`, built on first use.

The C source is compiled with the system C compiler (`$CC`, else `cc`) into a shared library
cached under `$XDG_CACHE_HOME/pdserve/kernels` (`~/.cache/pdserve/kernels` when XDG_CACHE_HOME is
unset, beside the demo model), named by a hash of the source, the flags and the CPU model, so an
edit or another machine never reuses a stale build; concurrent first builds race harmlessly (each
writes a temporary file, then renames it in place).
The library is called through `ctypes`, which releases the GIL for the call.

`load()` returns None when the kernel cannot be had (no compiler, a failed build, or
`PDSERVE_CPU_KERNELS=0`), and the caller keeps the torch reference: the compiled kernel is an
optimisation, never a requirement. It serves float32 only.
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
BUILD_TIMEOUT_S = 120


@functools.cache
def load() -> ctypes.CDLL | None:
    if os.environ.get("PDSERVE_CPU_KERNELS", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        logger.warning("no C compiler found: CPU decode attention uses the torch reference")
        return None
    try:
        library = ctypes.CDLL(str(_build(compiler)))
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("building %s failed, CPU decode attention uses the torch reference: %s", SOURCE.name, exc)
        return None
    function = library.paged_decode_attention_f32
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7 + [ctypes.c_float, ctypes.c_int32]
    return library


def _build(compiler: str) -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(CFLAGS).encode(), _cpu_model().encode()])).hexdigest()[:16]
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdserve" / "kernels"
    library_path = cache_dir / f"{SOURCE.stem}-{key}.so"
    if library_path.exists():
        return library_path
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache_dir, suffix=".so", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    try:
        subprocess.run([compiler, *CFLAGS, str(SOURCE), "-o", str(tmp_path), "-lm"],
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


def decode_attention(library: ctypes.CDLL, query, k_cache, v_cache, block_tables, context_lens, scale):
    """`kernels.decode_attention` for float32 CPU tensors of the documented layouts."""
    query = query.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    context_lens = context_lens.to(torch.int32).contiguous()
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads = k_cache.shape[:3]
    out = torch.empty_like(query)  # [num_seqs, num_heads, head_dim]
    status = library.paged_decode_attention_f32(
        out.data_ptr(), query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        block_tables.data_ptr(), context_lens.data_ptr(),
        num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, block_size, block_tables.shape[1],
        scale, torch.get_num_threads(),
    )
    if status == -1:
        raise MemoryError(f"decode attention: no scratch memory for {num_seqs} sequences")
    if status:
        seq = status - 1
        raise ValueError(f"decode attention: sequence {seq} has context length {int(context_lens[seq])} "
                         f"or a block id outside the pool of {num_blocks} blocks")
    return out
