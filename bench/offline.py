"""`pdserve bench offline`: pdserve's offline engine against vLLM's, per dtype, same prompts.

    prompts: bench.datasets "prompt-heavy" (seeded), --output-len each, greedy, ignore_eos
    for each --dtypes entry, each engine (bench.offline_engine) a warm-up, then --num-runs timed:
       pdserve  python -m pdserve.bench.offline_engine pdserve SPEC RESULT   (this interpreter)
       vllm     PEER_SCRIPT python bench/offline_engine.py vllm SPEC RESULT   (the peer's)
    result dir: offline.json, then the report layer's offline.md; logs/<engine>_<dtype>.log

Invariant: the engines run one at a time, each started as `bench.systems.launch` starts a system
(its own process group, on every CPU this process may use, one thread each), reading one spec; an
engine's figures are the median of its timed runs. One that fails is recorded with the reason and
the rest still run; without --peer-vllm pdserve runs alone.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from pdserve.bench.machine import provenance
from pdserve.bench.peer_model import peer_model_dir
from pdserve.bench.report_offline import RESULT_JSON_NAME, write_report
from pdserve.bench.systems import DTYPES, SystemUnavailable, add_kv_cache_memory_argument, all_cpus, launch, peer_script

logger = logging.getLogger(__name__)

ENGINES = ("pdserve", "vllm")


def measure(engine: str, dtype: str, spec: dict, args: argparse.Namespace, cpus: tuple[int, ...]) -> dict:
    """One engine at one dtype: its figures, or why there are none."""
    try:
        vllm_script = peer_script(args.peer_vllm, "--peer-vllm") if engine == "vllm" else None
    except SystemUnavailable as error:
        return {"status": "skipped", "note": str(error)}
    logs = args.result_dir.resolve() / "logs"
    name = f"{engine}_{dtype}"
    spec_path, result_path, log_path = logs / f"{name}_spec.json", logs / f"{name}.json", logs / f"{name}.log"
    model_dir = Path(spec["model"]) if vllm_script is None else peer_model_dir(Path(spec["model"]), logs)
    spec_path.write_text(json.dumps({**spec, "model": str(model_dir), "dtype": dtype}))
    result_path.unlink(missing_ok=True)
    # pdserve's as a module: run as a file, bench/'s own modules would shadow others.
    runner = ([sys.executable, "-m", "pdserve.bench.offline_engine"] if vllm_script is None
              else [vllm_script, "python", str(Path(__file__).with_name("offline_engine.py"))])
    process = launch([*runner, engine, str(spec_path), str(result_path)], cpus, log_path)
    try:
        exit_status = process.wait(timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return {"status": "failed", "note": f"timed out after {args.timeout_s:g} s; see logs/{log_path.name}"}
    if exit_status != 0 or not result_path.is_file():
        return {"status": "failed", "note": f"exit status {exit_status}; see logs/{log_path.name}"}
    run = json.loads(result_path.read_text())
    seconds = statistics.median(run["timed_s"])
    logger.info("%s %s: median %.2f s over %d timed runs", engine, dtype, seconds, len(run["timed_s"]))
    return {"status": "ok", "seconds": seconds, **run, "output_tok_per_s": run["num_output_tokens"] / seconds,
            "total_tok_per_s": (run["num_prompt_tokens"] + run["num_output_tokens"]) / seconds}


def num_same_outputs(results: dict[str, dict]) -> int | None:
    """How many prompts got the same greedy tokens from both engines (None unless both ran)."""
    if any(results.get(engine, {}).get("status") != "ok" for engine in ENGINES):
        return None
    return sum(mine == theirs for mine, theirs in zip(results["pdserve"]["output_token_ids"],
                                                      results["vllm"]["output_token_ids"]))


def run_offline(args: argparse.Namespace, cpus: tuple[int, ...]) -> dict:
    from transformers import AutoTokenizer

    from pdserve.bench.datasets import make_dataset
    from pdserve.checkpoints.model_ref import resolve_model

    model_dir = resolve_model(args.model, os.environ).model_dir.resolve()
    requests = make_dataset("prompt-heavy", num_prompts=args.num_prompts, seed=args.seed,
                            output_len=args.output_len, tokenizer=AutoTokenizer.from_pretrained(str(model_dir)))
    prompt_token_ids = [request.prompt_token_ids for request in requests]
    lens = [len(ids) for ids in prompt_token_ids]
    spec = {"model": str(model_dir), "prompt_token_ids": prompt_token_ids, "output_len": args.output_len,
            "num_timed_runs": args.num_runs, "kv_cache_memory_bytes": args.kv_cache_memory}
    (args.result_dir / "logs").mkdir(parents=True, exist_ok=True)
    combined = {
        **provenance(model_dir, None),  # vLLM's version comes with its runs
        "workload": {"dataset": "prompt-heavy", "num_prompts": args.num_prompts, "output_len": args.output_len,
                     "seed": args.seed, "ignore_eos": True, "temperature": 0.0, "num_warmup_runs": 1,
                     "num_timed_runs": args.num_runs, "input_lens": {
                         "min": min(lens), "mean": round(statistics.fmean(lens), 1), "max": max(lens),
                         "total": sum(lens)}},
        "cpus": list(cpus), "num_threads": len(cpus), "dtypes": {}}
    for dtype in args.dtypes:
        results = {engine: measure(engine, dtype, spec, args, cpus) for engine in ENGINES}
        same = num_same_outputs(results)
        for result in results.values():
            result.pop("output_token_ids", None)  # compared above; too bulky to keep
        combined["dtypes"][dtype] = {"engines": results, "num_same_outputs": same}
    (args.result_dir / RESULT_JSON_NAME).write_text(json.dumps(combined, indent=1, allow_nan=False))
    write_report(combined, args.result_dir)
    return combined


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "pdserve's offline LLM.generate against vLLM's, per dtype, on the same prompts and CPUs."
    parser.add_argument("--model", metavar="SPEC", help="what `pdserve up --model` takes (default: SmolLM2)")
    parser.add_argument("--peer-vllm", type=Path, metavar="SCRIPT", help="../shared/peers/vllm-cpu (else no vLLM)")
    parser.add_argument("--dtypes", type=lambda text: tuple(dict.fromkeys(text.split(","))), default=DTYPES,
                        metavar="LIST", help=f"comma-separated, from {','.join(DTYPES)} (default both)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-runs", type=int, default=3, help="timed runs after the warm-up")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per engine and dtype")
    parser.add_argument("--result-dir", type=Path, default=Path("bench/results/offline"))
    add_kv_cache_memory_argument(parser)


def run(args: argparse.Namespace) -> int:
    if args.num_prompts < 1 or args.output_len < 1 or args.num_runs < 1 or not set(args.dtypes) <= set(DTYPES):
        raise SystemExit("pdserve bench offline: --num-prompts, --output-len and --num-runs must be at least 1, "
                         f"--dtypes from {','.join(DTYPES)}")
    combined = run_offline(args, all_cpus())  # `taskset` picks them
    print(args.result_dir / RESULT_JSON_NAME)
    return 0 if all(result["status"] != "failed" for entry in combined["dtypes"].values()
                    for result in entry["engines"].values()) else 1
