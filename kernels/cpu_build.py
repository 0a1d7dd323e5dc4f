"""Builds a C source of `kernels/csrc/` into a shared library with the system C compiler, once.

The compiler is `$CC`, else `cc`. The library is cached under `$XDG_CACHE_HOME/pdserve/kernels`
(`~/.cache/pdserve/kernels` when XDG_CACHE_HOME is unset, beside the demo model), named by a hash
of the source, the headers of csrc/, the flags and the CPU model, so an edit or another machine
never reuses a stale build; concurrent first builds race harmlessly (each writes a temporary
file, then renames it in place). `PDSERVE_CPU_KERNELS=0` turns every compiled CPU kernel off:
callers keep their torch code, the compiled kernels being an optimisation, never a requirement.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
# 512-bit vectors where the CPU has them (GCC prefers 256 by default); libm's vector exp under
# `omp simd` (no errno to set).
CFLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fassociative-math", "-fno-signed-zeros",
          "-fno-trapping-math", "-fno-math-errno", "-fopenmp", "-shared", "-fPIC", "-std=c11")
BUILD_TIMEOUT_S = 120


def enabled() -> bool:
    return os.environ.get("PDSERVE_CPU_KERNELS", "1") != "0"


def load_build_for(source_name: str, flags_by_dtype: dict, dtype) -> ctypes.CDLL | None:
    """`load_library` of the build for `dtype` (`flags_by_dtype[dtype]`); None also when compiled
    kernels are off or `dtype` has no build."""
    if not enabled() or dtype not in flags_by_dtype:
        return None
    return load_library(source_name, flags_by_dtype[dtype])


def load_library(source_name: str, flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """`csrc/<source_name>` built with CFLAGS + `flags` and loaded; None (with a warning) when
    there is no compiler or the build fails."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        logger.warning("no C compiler found: %s is not built, torch code runs instead", source_name)
        return None
    try:
        return ctypes.CDLL(str(_build(compiler, CSRC / source_name, CFLAGS + flags)))
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("building %s failed, torch code runs instead: %s", source_name, exc)
        return None


def _build(compiler: str, source_path: Path, flags: tuple[str, ...]) -> Path:
    headers = [path.read_bytes() for path in sorted(CSRC.glob("*.h"))]  # what a source may include
    key = hashlib.sha256(b"\0".join([source_path.read_bytes(), *headers, " ".join(flags).encode(),
                                      _cpu_model().encode()])).hexdigest()[:16]
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdserve" / "kernels"
    library_path = cache_dir / f"{source_path.stem}-{key}.so"
    if library_path.exists():
        return library_path
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache_dir, suffix=".so", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    try:
        subprocess.run([compiler, *flags, str(source_path), "-o", str(tmp_path), "-lm"],
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
