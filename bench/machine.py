"""What a result records besides its figures: the machine, the software versions, the model.

Absolute times on shared machines are noise, so every result names the CPU (its vector
extensions: AVX-512, AMX or not), the usable CPUs, torch's and vLLM's versions and the commit.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from pathlib import Path

LSCPU_KEYS = ("Architecture", "Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
              "NUMA node(s)", "L2 cache", "L3 cache", "Hypervisor vendor", "Flags")


def machine_summary() -> dict:
    """What `lscpu` says about the CPUs (of its flags, the vector extensions only), memory, kernel."""
    summary: dict = {"kernel": platform.release(), "usable_cpus": sorted(os.sched_getaffinity(0))}
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        lines = ""
    for line in lines.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in LSCPU_KEYS:
            summary[key] = value if key != "Flags" else " ".join(
                flag for flag in value.split() if flag.startswith(("avx", "amx", "fma")))
    summary["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return summary


def versions(peer_vllm: Path | None) -> dict:
    import torch
    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__,
             "transformers": transformers.__version__, "pdserve_commit": _git_commit()}
    if peer_vllm is not None and peer_vllm.is_file():
        try:
            found["vllm"] = subprocess.run(
                [str(peer_vllm), "python", "-c", "import vllm; print(vllm.__version__)"],
                capture_output=True, text=True, timeout=120, check=True).stdout.strip().splitlines()[-1]
        except (OSError, subprocess.SubprocessError, IndexError):
            found["vllm"] = "unknown"
    return found


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              check=True, cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def model_summary(model_dir: Path) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "vocab_size", "torch_dtype", "dtype")
    return {"dir": model_dir.name, "architectures": config.get("architectures"),
            **{key: config[key] for key in keys if key in config}}


def length_summary(lens: list[int]) -> dict:
    """Token counts of a dataset's prompts or outputs, as the reports state them."""
    return {"min": min(lens), "median": float(statistics.median(lens)), "mean": round(statistics.fmean(lens), 1),
            "max": max(lens), "total": sum(lens)}
