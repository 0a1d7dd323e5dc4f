"""`pdserve bench serve`: one run, flags shaped like `vllm bench serve`, against a running server
(`--target`) or a system it starts and stops itself (`--system`, bench.systems).

Results go to stdout as markdown; with `--result-dir DIR` also to `DIR/<label>.json` and the
report layer's `<label>.md` and `<label>_latency_cdf.png`. Exit status 1 when nothing completed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
from pathlib import Path

from pdserve.bench.client import BackendError
from pdserve.bench.datasets import DATASET_KINDS, make_dataset
from pdserve.bench.errors import BenchConfigError
from pdserve.bench.metrics import SLO_KEYS, parse_slos
from pdserve.bench.report_serve import render_markdown, write_report
from pdserve.bench.runner import BACKENDS, BenchConfig, run_benchmark
from pdserve.bench.systems import (SYSTEMS, SystemStartError, SystemUnavailable, add_system_arguments, options_from,
                                   started)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Sends a dataset (greedy, every output token generated) to a server at a Poisson request "
                          "rate or a concurrency cap and reports TTFT, TPOT, ITL, E2EL, throughput and goodput with "
                          "vLLM's field names, and the server's own Prometheus figures.")
    target = parser.add_argument_group("server: --target (running) or --system (started here)")
    target.add_argument("--backend", choices=BACKENDS, default="openai",
                        help="openai: /v1/completions; grpc: the gateway's pdserve.v1.Gateway/Generate")
    target.add_argument("--target", help="openai: a base URL such as http://127.0.0.1:8000/v1; grpc: HOST:PORT")
    target.add_argument("--metrics-url", help="a Prometheus /metrics URL to scrape before and after")
    target.add_argument("--system", choices=SYSTEMS, help="start this system, measure it, stop it")
    target.add_argument("--model", help="--target's model id (default: the first listed), or --system's model")
    add_system_arguments(target, model=False)
    data = parser.add_argument_group("dataset")
    data.add_argument("--dataset", choices=DATASET_KINDS, default="random")
    data.add_argument("--num-prompts", type=int, default=1000)
    data.add_argument("--input-len", type=int, default=1024)
    data.add_argument("--output-len", type=int, default=128)
    data.add_argument("--range-ratio", type=float, default=0.0, help="lengths drawn in len*(1-r)..len*(1+r)")
    data.add_argument("--tokenizer", type=Path, metavar="MODEL_DIR", help="draws the prompts (--system: its model)")
    load = parser.add_argument_group("load")
    load.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (default inf: all at once)")
    load.add_argument("--max-concurrency", type=int, help="most requests in flight at once")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--timeout-s", type=float, default=600.0, help="per-request deadline")
    load.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                      help=f"SLOs for goodput, keys {', '.join(SLO_KEYS)} (e.g. ttft:500 tpot:50)")
    out = parser.add_argument_group("output")
    out.add_argument("--result-dir", type=Path, help="write JSON, markdown and the plot here")
    out.add_argument("--label", help="name of the run and its files (default SYSTEM-DATASET)")
    out.add_argument("--disable-tqdm", action="store_true")


def run(args: argparse.Namespace) -> int:
    if (args.target is None) == (args.system is None):
        raise SystemExit("pdserve bench serve: give --target (a running server) or --system (one to start)")
    if args.target is not None:
        return run_against(args, args.target, args.model)
    try:
        options = options_from(args)
        with started(args.system, options, (args.result_dir or Path("bench/results/serve")) / "logs",
                     args.backend) as served:
            args.metrics_url = args.metrics_url or served.spec.metrics_url
            args.tokenizer = args.tokenizer or options.model_dir
            return run_against(args, served.target, served.model_id)
    except (SystemUnavailable, SystemStartError) as error:
        raise SystemExit(f"pdserve bench serve: {error}") from error


def run_against(args: argparse.Namespace, target: str, model: str | None) -> int:
    from pdserve.protocol.tokenizer import load_tokenizer

    try:
        config = BenchConfig(
            target=target, backend=args.backend, model=model, request_rate=args.request_rate,
            max_concurrency=args.max_concurrency, seed=args.seed, goodput_slos_ms=parse_slos(args.goodput),
            metrics_url=args.metrics_url, timeout_s=args.timeout_s,
            label=args.label or f"{args.system or args.backend}-{args.dataset}")
        requests = make_dataset(args.dataset, num_prompts=args.num_prompts, seed=args.seed, input_len=args.input_len,
                                output_len=args.output_len, range_ratio=args.range_ratio,
                                tokenizer=load_tokenizer(args.tokenizer) if args.tokenizer else None)
        result = asyncio.run(run_benchmark(config, requests, not args.disable_tqdm))
    except BenchConfigError as error:
        raise SystemExit(f"pdserve bench serve: {error}") from error
    except BackendError as error:
        raise SystemExit(f"pdserve bench serve: {target}: {error}") from error
    figures = result.to_json_dict()
    if args.result_dir is None:
        print(render_markdown(figures))
    else:
        args.result_dir.mkdir(parents=True, exist_ok=True)
        path = args.result_dir / f"{config.label}.json"
        path.write_text(json.dumps(figures, indent=2) + "\n")
        print(write_report(figures, path))
        print(path)
    return 0 if result.metrics.completed else 1
