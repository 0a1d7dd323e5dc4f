"""What a result records besides its figures: when, the command, the model, the machine (the CPU
and its vector extensions, AVX-512 or AMX: absolute times on shared machines are noise), the
versions of torch and vLLM and the commit.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

LSCPU_KEYS = ("Model name", "CPU(s)", "Thread(s) per core", "Socket(s)", "L3 cache", "Hypervisor vendor", "Flags")


def provenance(model_dir: Path, peer_vllm: Path | None) -> dict:
    """A result's "date", "command", "model", "machine" and "versions" (vLLM's through `peer_vllm`)."""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": ["pdserve", *sys.argv[1:]],
            "model": model_summary(model_dir), "machine": machine_summary(), "versions": versions(peer_vllm)}


def machine_summary() -> dict:
    """What `lscpu` says about the CPUs (of its flags, the vector extensions only), memory, kernel."""
    summary: dict = {"kernel": platform.release(), "usable_cpus": sorted(os.sched_getaffinity(0)),
                     "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}
    for line in _output(["lscpu"]).splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in LSCPU_KEYS:
            summary[key] = " ".join(f for f in value.split() if f.startswith(("avx", "amx", "fma"))) \
                if key == "Flags" else value
    return summary


def versions(peer_vllm: Path | None) -> dict:
    import torch
    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
             "pdserve_commit": _output(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short",
                                        "HEAD"]) or None}
    if peer_vllm is not None and peer_vllm.is_file():
        script = [str(peer_vllm), "python", "-c", "import vllm; print(vllm.__version__)"]
        found["vllm"] = (_output(script, timeout_s=120).splitlines() or ["unknown"])[-1]
    return found


def model_summary(model_dir: Path) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "vocab_size", "torch_dtype", "dtype")
    return {"dir": model_dir.name, "architectures": config.get("architectures"),
            **{key: config[key] for key in keys if key in config}}


def _output(argv: list[str], timeout_s: float = 10) -> str:
    """`argv`'s stdout, stripped; "" when it fails."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
