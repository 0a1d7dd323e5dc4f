"""`pdserve bench-compare`: several serving systems measured side by side in one invocation.

    dataset (built once: same model, same seed, same requests for every system)
       │
       ├─▶ static         launch ─▶ healthy ─▶ warm-up ─▶ the trace ─▶ /metrics ─▶ stop
       ├─▶ colocated      launch ─▶ ...                                        ─▶ stop
       ├─▶ disaggregated  launch ─▶ ...                                        ─▶ stop
       └─▶ vllm           launch ─▶ ...                                        ─▶ stop
                                              │
       result dir: compare.json (every system's vLLM-style result + date, machine, pinning,
       versions), compare.md (the table and the ratios), compare_*.png, logs/<system>.log

Invariant: one system runs at a time, and every one sees the same requests from the same client
(`bench.runner.run_benchmark` over the OpenAI HTTP API) with the same CPU pinning and thread
counts (`bench.systems.Pinning`). A system that cannot be run (no peer script) is skipped and
one that fails to start or breaks mid-run is recorded as failed, with the reason; the others
still run. Nothing here judges the figures: the report states ratios, never goals.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pdserve.bench.datasets import RANDOM_KINDS
from pdserve.bench.metrics import SLO_KEYS, parse_slos
from pdserve.bench.systems import (
    DTYPES,
    SYSTEMS,
    Pinning,
    RunningSystem,
    SystemOptions,
    SystemStartError,
    SystemUnavailable,
    cpu_list_text,
    default_pinning,
    parse_cpu_list,
    parse_systems,
    pin_this_process,
    system_spec,
)

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class CompareConfig:
    model_dir: Path
    systems: tuple[str, ...]
    dataset: str  # one of bench.datasets.RANDOM_KINDS
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float
    request_rate: float  # requests/s; inf sends every request at once (saturation)
    max_concurrency: int | None
    seed: int
    num_warmup_prompts: int
    pinning: Pinning
    result_dir: Path
    static_max_batch_size: int
    vllm_script: Path | None
    startup_timeout_s: float
    vllm_startup_timeout_s: float
    request_timeout_s: float
    dtype: str = "float32"  # every system loads the weights in it
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)  # "ttft" | "tpot" | "e2el"; {}: no goodput
    prefix_len: int = 0  # tokens every prompt starts with
    num_decode_replicas: int = 1  # of the disaggregated systems

    def workload_dict(self) -> dict:
        return {"dataset": self.dataset, "num_prompts": self.num_prompts, "input_len": self.input_len,
                "output_len": self.output_len, "range_ratio": self.range_ratio, "prefix_len": self.prefix_len,
                "request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
                "max_concurrency": self.max_concurrency, "seed": self.seed, "ignore_eos": True,
                "temperature": 0.0, "num_warmup_prompts": self.num_warmup_prompts, "dtype": self.dtype,
                "num_decode_replicas": self.num_decode_replicas,
                "goodput_slos_ms": dict(self.goodput_slos_ms)}


def run_compare(config: CompareConfig, argv: list[str]) -> dict:
    """Runs every system in turn; writes and returns the combined result."""
    from transformers import AutoTokenizer

    from pdserve.bench.compare_report import write_report
    from pdserve.bench.datasets import make_dataset

    machine = machine_summary()  # before pinning, so it lists every usable CPU
    config.result_dir.mkdir(parents=True, exist_ok=True)
    (config.result_dir / "logs").mkdir(exist_ok=True)
    pin_this_process(config.pinning.client_cpus)
    tokenizer = AutoTokenizer.from_pretrained(str(config.model_dir))

    def dataset(num_prompts: int, seed: int):
        return make_dataset(config.dataset, num_prompts=num_prompts, seed=seed, input_len=config.input_len,
                            output_len=config.output_len, range_ratio=config.range_ratio,
                            prefix_len=config.prefix_len, tokenizer=tokenizer)

    requests = dataset(config.num_prompts, config.seed)
    warmup = dataset(config.num_warmup_prompts, config.seed + 1) if config.num_warmup_prompts else []
    options = SystemOptions(config.model_dir, config.static_max_batch_size, config.vllm_script,
                            config.startup_timeout_s, config.vllm_startup_timeout_s, config.dtype,
                            config.num_decode_replicas)
    combined = {
        "schema_version": SCHEMA_VERSION,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": argv,
        "model": model_summary(config.model_dir),
        "workload": {**config.workload_dict(),
                     "input_lens": length_summary([len(request.prompt_token_ids) for request in requests]),
                     "output_lens": length_summary([request.output_len for request in requests])},
        "pinning": config.pinning.to_dict(),
        "machine": machine,
        "versions": versions(config.vllm_script if "vllm" in config.systems else None),
        "systems": {},
    }
    for name in config.systems:
        combined["systems"][name] = _run_one(name, options, config, requests, warmup)
    write_report(combined, config.result_dir)
    return combined


def _run_one(name: str, options: SystemOptions, config: CompareConfig, requests: list, warmup: list) -> dict:
    try:
        spec = system_spec(name, options)
    except SystemUnavailable as reason:
        logger.warning("%s: skipped: %s", name, reason)
        return {"status": "skipped", "note": str(reason), "result": None}
    log_path = config.result_dir / "logs" / f"{name}.log"
    entry = {"status": "failed", "description": spec.description, "argv": list(spec.argv),
             "log": str(log_path.relative_to(config.result_dir)), "result": None}
    logger.info("%s: starting %s", name, " ".join(spec.argv))
    started_s = time.monotonic()
    system = RunningSystem(spec, config.pinning, log_path)
    try:
        model_id = system.wait_ready()
        entry["startup_s"] = round(time.monotonic() - started_s, 2)
        logger.info("%s: up in %.1f s, serving %r; warming up", name, entry["startup_s"], model_id)
        if warmup:
            asyncio.run(_benchmark(name, spec, model_id, warmup, config, metrics=False, progress=False))
        logger.info("%s: running %d requests", name, len(requests))
        result = asyncio.run(_benchmark(name, spec, model_id, requests, config, metrics=True, progress=True))
    except SystemStartError as error:
        entry["note"] = str(error)
        logger.error("%s: %s", name, error)
        return entry
    except Exception as error:  # a broken run is this system's result, not the comparison's end
        entry["note"] = f"{type(error).__name__}: {error}\n{system.log_tail()}"
        logger.exception("%s: the run failed", name)
        return entry
    finally:
        exit_status = system.stop()
    entry["status"] = "ok"
    entry["exit_status"] = exit_status
    entry["result"] = result.to_json_dict()
    logger.info("%s: %d completed, %d failed, %.1f output tok/s", name, result.metrics.completed,
                result.metrics.failed, result.metrics.output_throughput)
    return entry


async def _benchmark(name: str, spec, model_id: str, requests: list, config: CompareConfig, *, metrics: bool,
                     progress: bool):
    from pdserve.bench.runner import BenchConfig, run_benchmark

    bench_config = BenchConfig(
        backend="openai", target=spec.base_url, model=model_id, request_rate=config.request_rate,
        max_concurrency=config.max_concurrency, seed=config.seed, ignore_eos=True, temperature=0.0,
        goodput_slos_ms=config.goodput_slos_ms, metrics_url=spec.metrics_url if metrics else None, timeout_s=config.request_timeout_s, label=name)
    return await run_benchmark(bench_config, requests, progress=progress)


def length_summary(lens: list[int]) -> dict:
    """Token counts of a dataset's prompts or outputs, as the report states them."""
    return {"min": min(lens), "median": float(statistics.median(lens)), "mean": round(statistics.fmean(lens), 1),
            "max": max(lens), "total": sum(lens)}


def machine_summary() -> dict:
    """What `lscpu` says about the CPUs, plus memory and kernel."""
    wanted = ("Architecture", "Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
              "NUMA node(s)", "L2 cache", "L3 cache", "Hypervisor vendor", "Flags")
    summary: dict = {"kernel": platform.release(), "usable_cpus": sorted(os.sched_getaffinity(0))}
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        lines = ""
    for line in lines.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in wanted:
            value = value.strip()
            if key.strip() == "Flags":  # only the vector extensions matter for these kernels
                value = " ".join(flag for flag in value.split() if flag.startswith(("avx", "amx", "fma")))
            summary[key.strip()] = value
    try:
        summary["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return summary


def versions(vllm_script: Path | None) -> dict:
    import aiohttp
    import torch
    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__,
             "transformers": transformers.__version__, "aiohttp": aiohttp.__version__,
             "pdserve_commit": _git_commit()}
    if vllm_script is not None and vllm_script.is_file():
        try:
            found["vllm"] = subprocess.run(
                [str(vllm_script), "python", "-c", "import vllm; print(vllm.__version__)"],
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
    import json

    config = json.loads((model_dir / "config.json").read_text())
    return {"dir": str(model_dir), "architectures": config.get("architectures"),
            **{key: config.get(key) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads", "intermediate_size", "vocab_size",
                                                "torch_dtype", "dtype")
               if key in config}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Launches each system in turn on loopback (pinned to the same CPUs), warms it up, "
                          "sends it the same trace with the same client, stops it; then writes one combined "
                          "JSON, a markdown table with ratios to static batching and to vLLM, and plots.")
    parser.add_argument("--model", type=Path, metavar="DIR",
                        help="Hugging Face model folder (default: the cached tiny model pdserve up serves)")
    parser.add_argument("--systems", default="static,colocated,disaggregated,vllm",
                        help=f"comma-separated, in run order, from {','.join(SYSTEMS)} (default: all)")
    parser.add_argument("--peer-vllm", type=Path, metavar="SCRIPT",
                        help="script whose `serve MODEL_DIR PORT` runs vLLM's OpenAI server on loopback; "
                             "without it the vllm system is skipped")
    parser.add_argument("--dataset", choices=RANDOM_KINDS, default="random",
                        help="prompt-heavy: prompts of 40-550 tokens; heavy-tailed: log-normal output lengths "
                             "with median --output-len/4; multi-turn: chats resending their history "
                             "(see bench.datasets)")
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--range-ratio", type=float, default=0.0)
    parser.add_argument("--prefix-len", type=int, default=0,
                        help="random tokens every prompt starts with (a shared system prompt)")
    parser.add_argument("--request-rate", type=float, default=math.inf,
                        help="requests/s, Poisson arrivals (default inf: all at once, saturation)")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-warmup-prompts", type=int, default=8)
    parser.add_argument("--server-cpus", type=parse_cpu_list, default=None, metavar="LIST",
                        help="CPUs every system's processes are pinned to, e.g. 1 or 2-7 "
                             "(default: all usable CPUs but the lowest)")
    parser.add_argument("--client-cpus", type=parse_cpu_list, default=None, metavar="LIST",
                        help="CPUs of the load-generating client (default: the lowest usable CPU)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="what every system loads the weights in (default float32)")
    parser.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                        help=f"SLOs for goodput, keys {', '.join(SLO_KEYS)} (e.g. ttft:1000 tpot:50): each system's "
                             "rate of requests that meet every one; stated in the report (default: no goodput)")
    parser.add_argument("--decode-replicas", type=int, default=1, metavar="M",
                        help="decode replicas of the disaggregated systems (default 1)")
    parser.add_argument("--static-max-batch-size", type=int, default=32)
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    parser.add_argument("--vllm-startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--request-timeout-s", type=float, default=900.0)
    parser.add_argument("--result-dir", type=Path, default=Path("bench/results"))


def config_from(args: argparse.Namespace) -> CompareConfig:
    from pdserve.checkpoints.tiny_model_cache import cache_root, ensure_tiny_model

    systems = parse_systems(args.systems)
    pinning = default_pinning(os.sched_getaffinity(0))
    pinning = Pinning(args.server_cpus or pinning.server_cpus, args.client_cpus or pinning.client_cpus)
    return CompareConfig(
        model_dir=(args.model or ensure_tiny_model(cache_root(os.environ))).resolve(), systems=systems,
        dataset=args.dataset, num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
        range_ratio=args.range_ratio, request_rate=args.request_rate, max_concurrency=args.max_concurrency,
        seed=args.seed, num_warmup_prompts=args.num_warmup_prompts, pinning=pinning, result_dir=args.result_dir,
        static_max_batch_size=args.static_max_batch_size, vllm_script=args.peer_vllm,
        startup_timeout_s=args.startup_timeout_s, vllm_startup_timeout_s=args.vllm_startup_timeout_s,
        request_timeout_s=args.request_timeout_s, dtype=args.dtype, goodput_slos_ms=parse_slos(args.goodput),
        prefix_len=args.prefix_len, num_decode_replicas=args.decode_replicas)


def run(args: argparse.Namespace) -> int:
    from pdserve.bench.errors import BenchConfigError

    try:
        config = config_from(args)
    except BenchConfigError as error:
        raise SystemExit(f"pdserve bench-compare: {error}") from error
    logger.info("servers on CPUs %s, client on CPUs %s, %d compute thread(s) per system",
                cpu_list_text(config.pinning.server_cpus), cpu_list_text(config.pinning.client_cpus),
                config.pinning.num_server_threads)
    combined = run_compare(config, ["pdserve", *sys.argv[1:]])
    from pdserve.bench.compare_report import COMBINED_JSON_NAME

    print(config.result_dir / COMBINED_JSON_NAME)
    return 0 if all(entry["status"] != "failed" for entry in combined["systems"].values()) else 1
