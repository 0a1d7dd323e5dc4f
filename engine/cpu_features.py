"""Whether this machine's CPU computes in bfloat16 in hardware, as /proc/cpuinfo's `flags` say:
AVX512-BF16 (`avx512_bf16`) or AMX (`amx_bf16`). Where it does, `--dtype auto` runs bfloat16 on
the CPU (engine_config.resolve_dtype); elsewhere bfloat16 is emulated and slower than float32.

`has_hardware_bf16` reads the text, `cpu_has_hardware_bf16` reads the file: the rule is tested
on any text, on any machine. Imports no torch: the processes that only parse the engine's
flags read it too.
"""
from __future__ import annotations

import functools
from pathlib import Path

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO_PATH = Path("/proc/cpuinfo")


def has_hardware_bf16(cpuinfo_text: str) -> bool:
    """True when a `flags` line of `cpuinfo_text` (x86's /proc/cpuinfo) names one of BF16_FLAGS."""
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and not BF16_FLAGS.isdisjoint(value.split()):
            return True
    return False


@functools.cache
def cpu_has_hardware_bf16(cpuinfo_path: Path = CPUINFO_PATH) -> bool:
    """`has_hardware_bf16` of this machine; False where there is no /proc/cpuinfo to read."""
    try:
        return has_hardware_bf16(cpuinfo_path.read_text())
    except OSError:
        return False
