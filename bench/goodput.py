"""`pdserve bench goodput`: DistServe's goodput of several systems, side by side, on one trace kind.

    for each system (one start each):
        launch ─▶ healthy ─▶ warm-up ─▶ for each repeat: search the rates (bench.goodput_search) ─▶ stop
    result dir: goodput.json (every point of every system, with the date, machine, pinning and
    versions), goodput.md (goodput per system, the ratios, every point), goodput.png (attainment
    against rate), logs/<system>.log

Invariant: at a given rate and repeat every system gets the same requests (the dataset's seed is
derived from the rate and the repeat), and no two rates or repeats share a prompt, so no system
answers a point from a cache the previous point warmed. Every system runs pinned to the same CPUs
with the same thread counts (bench.systems.Pinning).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import os
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pdserve.bench.compare import machine_summary, model_summary, versions
from pdserve.bench.datasets import RANDOM_KINDS, make_dataset
from pdserve.bench.errors import BenchConfigError
from pdserve.bench.goodput_report import JSON_NAME, write_report
from pdserve.bench.goodput_search import Point, attainment, goodput, search
from pdserve.bench.metrics import parse_slos
from pdserve.bench.runner import BenchConfig, BenchResult, run_benchmark
from pdserve.bench.sweep import parse_rates
from pdserve.bench.systems import (
    DTYPES,
    SYSTEMS,
    Pinning,
    RunningSystem,
    SystemOptions,
    SystemStartError,
    SystemUnavailable,
    parse_cpu_list,
    parse_systems,
    pin_this_process,
    system_spec,
)

logger = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class GoodputConfig:
    model_dir: Path
    systems: tuple[str, ...]
    slos_ms: dict[str, float]  # "ttft" | "tpot" | "e2el"
    target_attainment: float
    rates: list[float]  # requests/s, climbed in order
    bisect_steps: int
    repeats: int
    dataset: str
    num_prompts: int  # per point, at least
    duration_s: float  # of arrivals per point, at least: max(num_prompts, rate * duration_s) requests
    input_len: int
    output_len: int
    range_ratio: float
    seed: int
    num_warmup_prompts: int
    num_idle_prompts: int
    dtype: str
    num_prefill_replicas: int
    num_decode_replicas: int
    pinning: Pinning
    vllm_script: Path | None
    startup_timeout_s: float
    vllm_startup_timeout_s: float
    request_timeout_s: float
    result_dir: Path

    def workload_dict(self) -> dict:
        keys = ("dataset", "num_prompts", "duration_s", "input_len", "output_len", "range_ratio", "seed",
                "num_warmup_prompts", "num_idle_prompts", "dtype", "num_prefill_replicas", "num_decode_replicas",
                "slos_ms", "target_attainment", "rates", "bisect_steps", "repeats")
        return {key: getattr(self, key) for key in keys}


def point_seed(config: GoodputConfig, rate: float, repeat: int) -> int:
    """The dataset seed of a point; the warm-up and the idle run take those of rate 0 in the two
    repeats after the last."""
    return config.seed + 1_000_003 * repeat + round(rate * 1000)


def point_size(config: GoodputConfig, rate: float) -> int:
    """Requests at `rate`: enough that arrivals last `duration_s`, so a high rate runs long enough
    for queues to build as they would in a steady stream (40 requests at 5 req/s last 8 s)."""
    return max(config.num_prompts, math.ceil(rate * config.duration_s))


def summarize(result: BenchResult, rate: float, slos_ms: dict[str, float]) -> Point:
    figures = result.metrics.to_dict()
    gaps_ms = [gap * 1000 for record in result.records if record.success for gap in record.itl_s]
    keep = ("completed", "failed", "duration", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
            "median_tpot_ms", "p99_tpot_ms", "p99_itl_ms")
    return Point(rate, attainment(result.records, slos_ms),
                 {**{key: figures[key] for key in keep}, "max_itl_ms": max(gaps_ms, default=0.0)})


IDLE_SERVER_PARTS = {  # the server's histograms (pdserve's names follow vLLM's) -> what the report calls them
    "time_to_first_token_seconds": "server_ttft_ms",
    "request_queue_time_seconds": "server_queue_ms",
    "request_prefill_time_seconds": "server_prefill_ms",
    "kv_transfer_seconds": "kv_transfer_ms",
}


def idle_parts(result: BenchResult) -> dict[str, float | None]:
    """Means over a run of one request at a time, in ms: TTFT at the client and at the server,
    the server's queue (arrival to the prefilling engine) and prefill (from there to the first
    token) times, the KV transfer, and the first token to the second."""
    done = [record for record in result.records if record.success]
    parts: dict[str, float | None] = {
        "client_ttft_ms": 1000 * statistics.fmean(record.ttft_s for record in done) if done else None,
        "second_token_ms": 1000 * statistics.fmean(record.itl_s[0] for record in done if record.itl_s)
        if any(record.itl_s for record in done) else None}
    histograms = (result.server or {}).get("histograms", {})
    for name, part in IDLE_SERVER_PARTS.items():
        series = [figures for key, figures in histograms.items() if key.split("{")[0].split(":")[-1] == name]
        count = sum(figures["count"] for figures in series)
        parts[part] = 1000 * sum(figures["sum"] for figures in series) / count if count else None
    return parts


def run_system(name: str, config: GoodputConfig, tokenizer) -> dict:
    options = SystemOptions(config.model_dir, 1, config.vllm_script, config.startup_timeout_s,
                            config.vllm_startup_timeout_s, config.dtype, config.num_decode_replicas,
                            config.num_prefill_replicas)
    try:
        spec = system_spec(name, options)
    except SystemUnavailable as error:
        logger.warning("%s skipped: %s", name, error)
        return {"status": "skipped", "reason": str(error)}
    system = RunningSystem(spec, config.pinning, config.result_dir / "logs" / f"{name}.log")
    try:
        model_id = system.wait_ready()
        logger.info("%s is up (%s); warming up", name, spec.description)

        def bench(rate: float, label: str, num_prompts: int, seed: int, **options) -> BenchResult:
            """`num_prompts` requests of the dataset drawn with `seed`, arriving at `rate` (also seeded)."""
            prompts = make_dataset(config.dataset, num_prompts=num_prompts, seed=seed, input_len=config.input_len,
                                   output_len=config.output_len, range_ratio=config.range_ratio, tokenizer=tokenizer)
            bench_config = BenchConfig(backend="openai", target=spec.base_url, model=model_id, request_rate=rate,
                                       seed=seed, goodput_slos_ms=config.slos_ms, timeout_s=config.request_timeout_s,
                                       label=label, **options)
            return asyncio.run(run_benchmark(bench_config, prompts, progress=False))

        if config.num_warmup_prompts:
            bench(math.inf, f"{name}-warmup", config.num_warmup_prompts, point_seed(config, 0.0, config.repeats))
        idle = None
        if config.num_idle_prompts:  # one request at a time: TTFT and its parts with nothing queued
            idle = idle_parts(bench(math.inf, f"{name}-idle", config.num_idle_prompts,
                                    point_seed(config, 0.0, config.repeats + 1), max_concurrency=1,
                                    metrics_url=spec.metrics_url))
            logger.info("%s at idle: %s", name, ", ".join(f"{key} {value:.0f}" for key, value in idle.items()
                                                          if value is not None))
        repeats = []
        for repeat in range(config.repeats):
            def measure(rate: float) -> Point:
                result = bench(rate, f"{name}-r{repeat}-rate{rate:g}", point_size(config, rate),
                               point_seed(config, rate, repeat))
                point = summarize(result, rate, config.slos_ms)
                logger.info("%s repeat %d: %.3g req/s: %.0f %% met the SLOs (TTFT p50 %.0f ms p99 %.0f ms, "
                            "TPOT p50 %.0f ms p99 %.0f ms, ITL max %.0f ms)", name, repeat, rate,
                            100 * point.attainment, point.figures["median_ttft_ms"], point.figures["p99_ttft_ms"],
                            point.figures["median_tpot_ms"], point.figures["p99_tpot_ms"],
                            point.figures["max_itl_ms"])
                return point

            points = search(measure, config.rates, config.target_attainment, config.bisect_steps)
            found = goodput(points, config.target_attainment)
            repeats.append({"goodput": found,
                            "at_least": found == max(point.request_rate for point in points),  # no miss above
                            "points": [dataclasses.asdict(point) for point in points]})
    except SystemStartError as error:
        logger.error("%s", error)
        return {"status": "failed", "reason": str(error)}
    finally:
        system.stop()
    found = [entry["goodput"] or 0.0 for entry in repeats]
    return {"status": "ok", "description": spec.description, "idle": idle, "goodput": statistics.median(found),
            "at_least": all(entry["at_least"] for entry in repeats), "goodput_per_repeat": found, "repeats": repeats}


def run_goodput(config: GoodputConfig, argv: list[str]) -> dict:
    from transformers import AutoTokenizer

    machine = machine_summary()
    (config.result_dir / "logs").mkdir(parents=True, exist_ok=True)
    pin_this_process(config.pinning.client_cpus)
    tokenizer = AutoTokenizer.from_pretrained(str(config.model_dir))
    combined = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": argv,
        "model": {**model_summary(config.model_dir), "dir": config.model_dir.name}, "workload": config.workload_dict(),
        "pinning": config.pinning.to_dict(), "machine": machine,
        "versions": versions(config.vllm_script if "vllm" in config.systems else None), "systems": {},
    }
    for name in config.systems:
        combined["systems"][name] = run_system(name, config, tokenizer)
        write_report(combined, config.result_dir)  # after each system: a long run shows its progress
    return combined


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("DistServe's goodput: for each system, one start, then a climb over request rates with "
                          "fresh prompts at each (bisected between the last rate that met the target and the first "
                          "that missed), the highest rate at which --attainment of requests meet every SLO.")
    parser.add_argument("--model", metavar="SPEC",
                        help="what `pdserve up --model` takes (default: SmolLM2-135M-Instruct, fetched once)")
    parser.add_argument("--systems", default="colocated,disaggregated,vllm",
                        help=f"comma-separated, from {','.join(SYSTEMS)} (default: colocated,disaggregated,vllm)")
    parser.add_argument("--peer-vllm", type=Path, metavar="SCRIPT",
                        help="script whose `serve MODEL_DIR PORT` runs vLLM's OpenAI server; without it vllm is skipped")
    parser.add_argument("--slo", nargs="+", default=["ttft:2000", "tpot:150"], metavar="KEY:MS",
                        help="SLOs every request must meet (default: ttft:2000 tpot:150)")
    parser.add_argument("--attainment", type=float, default=0.9,
                        help="fraction of requests that must meet the SLOs (default 0.9)")
    parser.add_argument("--rates", type=parse_rates, default=[0.5, 1, 2, 3, 4, 5, 6.5, 8], metavar="R1,R2,...",
                        help="request rates to climb, req/s (default 0.5,1,2,3,4,5,6.5,8)")
    parser.add_argument("--bisect-steps", type=int, default=1,
                        help="runs between the last rate met and the first missed (default 1)")
    parser.add_argument("--repeats", type=int, default=1, help="searches per system, each with other prompts")
    parser.add_argument("--dataset", choices=RANDOM_KINDS, default="words",
                        help="default words: distinct prompts of --input-len ± --range-ratio words")
    parser.add_argument("--num-prompts", type=int, default=40, help="requests per rate, at least (default 40)")
    parser.add_argument("--duration-s", type=float, default=30.0,
                        help="seconds of arrivals per rate, at least: more requests at high rates (default 30)")
    parser.add_argument("--input-len", type=int, default=300)
    parser.add_argument("--range-ratio", type=float, default=0.5)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-warmup-prompts", type=int, default=4)
    parser.add_argument("--num-idle-prompts", type=int, default=8,
                        help="requests sent one at a time before the search, for TTFT at idle and its parts")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--prefill-replicas", type=int, default=1, metavar="N", help="of disaggregated (default 1)")
    parser.add_argument("--decode-replicas", type=int, default=1, metavar="M", help="of disaggregated (default 1)")
    parser.add_argument("--server-cpus", type=parse_cpu_list, metavar="LIST",
                        help="CPUs every system runs on (default: every usable CPU)")
    parser.add_argument("--client-cpus", type=parse_cpu_list, metavar="LIST",
                        help="CPUs of the client (default: every usable CPU, shared with the servers)")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--vllm-startup-timeout-s", type=float, default=900.0)
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    parser.add_argument("--result-dir", type=Path, default=Path("bench/results/goodput"))


def config_from(args: argparse.Namespace) -> GoodputConfig:
    from pdserve.checkpoints.model_ref import resolve_model

    systems = parse_systems(args.systems)
    if not 0 < args.attainment <= 1:
        raise BenchConfigError(f"--attainment must be in (0, 1], got {args.attainment}")
    if args.bisect_steps < 0 or args.repeats < 1 or args.num_prompts < 1 or args.duration_s < 0:
        raise BenchConfigError("--bisect-steps and --duration-s must be >= 0, --repeats and --num-prompts >= 1")
    slos_ms = parse_slos(args.slo)
    if not slos_ms:
        raise BenchConfigError("goodput needs at least one --slo")
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    return GoodputConfig(
        model_dir=resolve_model(args.model, os.environ).model_dir.resolve(), systems=systems, slos_ms=slos_ms,
        target_attainment=args.attainment, rates=args.rates, bisect_steps=args.bisect_steps, repeats=args.repeats,
        dataset=args.dataset, num_prompts=args.num_prompts, duration_s=args.duration_s, input_len=args.input_len,
        output_len=args.output_len, range_ratio=args.range_ratio, seed=args.seed,
        num_warmup_prompts=args.num_warmup_prompts, num_idle_prompts=args.num_idle_prompts, dtype=args.dtype,
        num_prefill_replicas=args.prefill_replicas, num_decode_replicas=args.decode_replicas,
        pinning=Pinning(args.server_cpus or cpus, args.client_cpus or cpus), vllm_script=args.peer_vllm,
        startup_timeout_s=args.startup_timeout_s, vllm_startup_timeout_s=args.vllm_startup_timeout_s,
        request_timeout_s=args.request_timeout_s, result_dir=args.result_dir)


def run(args: argparse.Namespace) -> int:
    from pdserve.checkpoints.errors import CheckpointError

    try:
        config = config_from(args)
    except (BenchConfigError, CheckpointError) as error:
        raise SystemExit(f"pdserve bench goodput: {error}") from error
    combined = run_goodput(config, ["pdserve", *sys.argv[1:]])
    print(config.result_dir / JSON_NAME)
    return 0 if all(entry["status"] != "failed" for entry in combined["systems"].values()) else 1
