"""`pdserve bench goodput`: DistServe's goodput of several systems, side by side (the headline).

    each system, one start: start ─▶ healthy ─▶ warm-up ─▶ idle run ─▶ each repeat: search ─▶ stop
    result dir: goodput.json, then the report layer's goodput.md and goodput.png; logs/<system>.log

Invariant: at a given rate and repeat every system gets the same requests (the dataset's seed is
derived from the rate and the repeat), and no two rates or repeats share a prompt, so no system
answers a point from a cache the previous point warmed. Every system runs on the same CPUs, those
this process may use, shared with the client (bench.systems).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import statistics
from pathlib import Path

from pdserve.bench.datasets import DATASET_KINDS, make_dataset
from pdserve.bench.engine_time import busy_text, engine_time
from pdserve.bench.errors import BenchConfigError
from pdserve.bench.goodput_search import Point, attainment, goodput, search
from pdserve.bench.machine import provenance
from pdserve.bench.metrics import parse_slos
from pdserve.bench.report_goodput import JSON_NAME, write_report
from pdserve.bench.runner import BACKENDS, BenchResult, run_on
from pdserve.bench.systems import (SystemStartError, SystemUnavailable, add_system_arguments, all_cpus,
                                   options_from, parse_systems, started)

logger = logging.getLogger(__name__)

WORKLOAD_KEYS = ("backend", "dataset", "num_prompts", "duration_s", "input_len", "output_len", "range_ratio", "seed",
                 "num_warmup_prompts", "num_idle_prompts", "dtype", "prefill_replicas", "decode_replicas", "slos_ms",
                 "rates", "bisect_steps", "repeats")
IDLE_SERVER_PARTS = {  # the server's histograms (pdserve's names follow vLLM's) -> the report's names
    "time_to_first_token_seconds": "server_ttft_ms", "request_queue_time_seconds": "server_queue_ms",
    "request_prefill_time_seconds": "server_prefill_ms", "kv_transfer_seconds": "kv_transfer_ms"}
POINT_FIGURES = ("completed", "failed", "duration", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
                 "median_tpot_ms", "p99_tpot_ms", "p99_itl_ms")


def point_seed(args: argparse.Namespace, rate: float, repeat: int) -> int:
    """A point's dataset seed; the warm-up and idle runs take rate 0's in the two repeats after the last."""
    return args.seed + 1_000_003 * repeat + round(rate * 1000)


def idle_parts(result: BenchResult) -> dict[str, float | None]:
    """Means in ms over a run of one request at a time: TTFT at the client, the first token to the
    second, and the server's parts of TTFT (IDLE_SERVER_PARTS) where its /metrics has them."""
    done = [record for record in result.records if record.success]
    gaps = [record.itl_s[0] for record in done if record.itl_s]
    parts: dict[str, float | None] = {
        "client_ttft_ms": 1000 * statistics.fmean(record.ttft_s for record in done) if done else None,
        "second_token_ms": 1000 * statistics.fmean(gaps) if gaps else None}
    histograms = (result.server or {}).get("histograms", {})
    for name, part in IDLE_SERVER_PARTS.items():
        series = [figures for key, figures in histograms.items() if key.split("{")[0].split(":")[-1] == name]
        count = sum(figures["count"] for figures in series)
        parts[part] = 1000 * sum(figures["sum"] for figures in series) / count if count else None
    return parts


def run_system(name: str, args: argparse.Namespace, tokenizer) -> dict:
    def bench(served, rate: float, label: str, num_prompts: int, seed: int, **options) -> BenchResult:
        prompts = make_dataset(args.dataset, num_prompts=num_prompts, seed=seed, input_len=args.input_len,
                               output_len=args.output_len, range_ratio=args.range_ratio, tokenizer=tokenizer)
        return run_on(served, prompts, label, request_rate=rate, seed=seed, goodput_slos_ms=args.slos_ms,
                      timeout_s=args.request_timeout_s, **options)

    def measure(served, rate: float, repeat: int) -> Point:
        # At least --duration-s of arrivals, so that queues build at a high rate as in a steady stream.
        num_prompts = max(args.num_prompts, math.ceil(rate * args.duration_s))
        result = bench(served, rate, f"{name}-r{repeat}-rate{rate:g}", num_prompts, point_seed(args, rate, repeat),
                       scrape=True)
        figures = result.metrics.to_dict()
        gaps_ms = [gap * 1000 for record in result.records if record.success for gap in record.itl_s]
        engines = engine_time(result.server)
        point = Point(rate, attainment(result.records, args.slos_ms),
                      {**{key: figures[key] for key in POINT_FIGURES}, "max_itl_ms": max(gaps_ms, default=0.0),
                       "engines": engines})
        logger.info("%s repeat %d: %.3g req/s: %.0f %% met the SLOs (%s)%s", name, repeat, rate,
                    100 * point.attainment, {key: point.figures[key] for key in POINT_FIGURES},
                    f"; busy: {busy_text(engines, figures['duration'])}" if engines else "")
        return point

    try:
        with started(name, args.options, args.result_dir / "logs", args.backend) as served:
            if args.num_warmup_prompts:
                bench(served, math.inf, f"{name}-warmup", args.num_warmup_prompts, point_seed(args, 0, args.repeats))
            idle = idle_parts(bench(served, math.inf, f"{name}-idle", args.num_idle_prompts,
                                    point_seed(args, 0, args.repeats + 1), max_concurrency=1, scrape=True)) \
                if args.num_idle_prompts else None
            repeats = []
            for repeat in range(args.repeats):
                points = search(lambda rate: measure(served, rate, repeat), args.rates, args.attainment,
                                args.bisect_steps)
                found = goodput(points, args.attainment)
                repeats.append({"goodput": found,
                                "at_least": found == max(point.request_rate for point in points),  # no miss above
                                "points": [dataclasses.asdict(point) for point in points]})
    except SystemUnavailable as error:
        logger.warning("%s skipped: %s", name, error)
        return {"status": "skipped", "reason": str(error)}
    except SystemStartError as error:
        logger.error("%s", error)
        return {"status": "failed", "reason": str(error)}
    found = [entry["goodput"] or 0.0 for entry in repeats]
    return {"status": "ok", "description": served.spec.description, "idle": idle, "goodput": statistics.median(found),
            "at_least": all(entry["at_least"] for entry in repeats), "goodput_per_repeat": found, "repeats": repeats}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("DistServe's goodput: for each system, one start, then a climb over request rates with "
                          "fresh prompts at each, bisected between the last rate met and the first missed.")
    add_system_arguments(parser)
    parser.add_argument("--systems", default="colocated,disaggregated,vllm", help="comma-separated")
    parser.add_argument("--backend", choices=BACKENDS, default="openai", help="grpc: pdserve up's gateway alone")
    parser.add_argument("--slo", nargs="+", default=["ttft:2000", "tpot:150"], metavar="KEY:MS",
                        help="SLOs every request must meet (default: ttft:2000 tpot:150)")
    parser.add_argument("--attainment", type=float, default=0.9, help="share of requests that must meet the SLOs")
    parser.add_argument("--rates", type=lambda text: [float(rate) for rate in text.split(",")],
                        default=[0.5, 1, 2, 3, 4, 5, 6.5, 8], metavar="R1,R2,...",
                        help="request rates to climb, req/s (default 0.5,1,2,3,4,5,6.5,8)")
    parser.add_argument("--bisect-steps", type=int, default=1, help="runs between the last rate met and the next")
    parser.add_argument("--repeats", type=int, default=1, help="searches per system, each with other prompts")
    parser.add_argument("--dataset", choices=DATASET_KINDS, default="words")
    parser.add_argument("--num-prompts", type=int, default=40, help="requests per rate, at least")
    parser.add_argument("--duration-s", type=float, default=30.0, help="seconds of arrivals per rate, at least")
    parser.add_argument("--input-len", type=int, default=300)
    parser.add_argument("--range-ratio", type=float, default=0.5)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-warmup-prompts", type=int, default=4)
    parser.add_argument("--num-idle-prompts", type=int, default=8, help="sent one at a time first: TTFT at idle")
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    parser.add_argument("--result-dir", type=Path, default=Path("bench/results/goodput"))


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from pdserve.checkpoints.errors import CheckpointError

    try:
        systems = parse_systems(args.systems)
        args.slos_ms = parse_slos(args.slo)
        if (not args.slos_ms or not 0 < args.attainment <= 1 or args.repeats < 1 or args.num_prompts < 1
                or not all(rate > 0 for rate in args.rates)):
            raise BenchConfigError("goodput needs an --slo, --attainment in (0, 1], --repeats and --num-prompts >= 1, "
                                   "positive --rates")
        args.options = options_from(args)
    except (BenchConfigError, CheckpointError) as error:
        raise SystemExit(f"pdserve bench goodput: {error}") from error
    combined = {**provenance(args.options.model_dir, args.peer_vllm if "vllm" in systems else None),
                "workload": {**{key: getattr(args, key) for key in WORKLOAD_KEYS},
                             "target_attainment": args.attainment},
                "pinning": {"server_cpus": list(all_cpus()), "client_cpus": list(all_cpus()),
                            "server_threads": len(all_cpus())}, "systems": {}}
    tokenizer = AutoTokenizer.from_pretrained(str(args.options.model_dir))
    (args.result_dir / "logs").mkdir(parents=True, exist_ok=True)
    for name in systems:
        combined["systems"][name] = run_system(name, args, tokenizer)
        (args.result_dir / JSON_NAME).write_text(json.dumps(combined, indent=2) + "\n")
        write_report(combined, args.result_dir)  # after each system: a long run shows its progress
    print(args.result_dir / JSON_NAME)
    return 0 if all(entry["status"] != "failed" for entry in combined["systems"].values()) else 1
