"""Whether this machine's CPU computes in bfloat16 in hardware, as /proc/cpuinfo's `flags` say:
AVX512-BF16 (`avx512_bf16`) or AMX (`amx_bf16`). Where it does, `--dtype auto` runs bfloat16 on
the CPU (engine_config.resolve_dtype); elsewhere bfloat16 is emulated and slower than float32.
Whether it has AMX tiles (`amx_bf16`): there a bfloat16 GEMM outruns the int8 prefill kernel
(engine/block_linear.py).

`has_hardware_bf16` and `has_amx` read the text, `cpu_has_hardware_bf16` and `cpu_has_amx` the
file: the rules are tested on any text, on any machine. Imports no torch: the processes that only
parse the engine's flags read it too.
"""
from __future__ import annotations

import functools
from pathlib import Path

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
AMX_FLAGS = frozenset({"amx_bf16"})
CPUINFO_PATH = Path("/proc/cpuinfo")


def has_hardware_bf16(cpuinfo_text: str) -> bool:
    """True when a `flags` line of `cpuinfo_text` (x86's /proc/cpuinfo) names one of BF16_FLAGS."""
    return _names_a_flag(cpuinfo_text, BF16_FLAGS)


def has_amx(cpuinfo_text: str) -> bool:
    """True when a `flags` line of `cpuinfo_text` names one of AMX_FLAGS."""
    return _names_a_flag(cpuinfo_text, AMX_FLAGS)


@functools.cache
def cpu_has_hardware_bf16(cpuinfo_path: Path = CPUINFO_PATH) -> bool:
    """`has_hardware_bf16` of this machine; False where there is no /proc/cpuinfo to read."""
    return has_hardware_bf16(_read(cpuinfo_path))


@functools.cache
def cpu_has_amx(cpuinfo_path: Path = CPUINFO_PATH) -> bool:
    """`has_amx` of this machine; False where there is no /proc/cpuinfo to read."""
    return has_amx(_read(cpuinfo_path))


def _names_a_flag(cpuinfo_text: str, flags: frozenset[str]) -> bool:
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and not flags.isdisjoint(value.split()):
            return True
    return False


def _read(cpuinfo_path: Path) -> str:
    try:
        return cpuinfo_path.read_text()
    except OSError:
        return ""
