"""`pdserve bench offline`: pdserve's offline engine against vLLM's, per dtype, same prompts.

    prompts: bench.datasets "prompt-heavy" (seeded; 40..550 tokens in, --output-len out each,
             greedy, ignore_eos)
       │
       for each --dtypes entry:
       ├─▶ pdserve  python -m pdserve.bench.offline_engine pdserve SPEC RESULT   (this interpreter)
       └─▶ vllm     PEER_SCRIPT python bench/offline_engine.py vllm SPEC RESULT   (the peer's)
                    each: one warm-up generate of every prompt, then --num-runs timed ones
       │
    result dir: offline.json (everything, per engine per dtype), then the report layer's
    offline.md (seconds, output and total tok/s, pdserve ÷ vLLM); logs/

Invariant: the engines run one at a time, each in its own process (its children included) on
the same CPUs with the same thread-count environment (`bench.systems.Pinning.server_env`),
reading the same spec file; an engine's figures are the median of its timed runs. One that
fails is recorded with the reason and the rest still run; without --peer-vllm pdserve runs alone.
Each engine's output is in logs/<engine>_<dtype>.log; both start as `bench.systems.launch`
starts a system.
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
from datetime import datetime, timezone
from pathlib import Path

from pdserve.bench.machine import length_summary, machine_summary, model_summary, versions
from pdserve.bench.report_offline import RESULT_JSON_NAME, write_report
from pdserve.bench.systems import DTYPES, SystemUnavailable, all_cpus, launch, parse_cpu_list, peer_script

logger = logging.getLogger(__name__)

ENGINES = ("pdserve", "vllm")


def engine_argv(engine: str, spec_path: Path, result_path: Path, vllm_script: str | None) -> list[str]:
    if engine == "pdserve":  # as a module: run as a file, bench/'s own modules would shadow others
        runner = [sys.executable, "-m", "pdserve.bench.offline_engine"]
    else:
        runner = [vllm_script, "python", str(Path(__file__).with_name("offline_engine.py"))]
    return [*runner, engine, str(spec_path), str(result_path)]


def run_engine(argv: list[str], cpus: tuple[int, ...], log_path: Path, timeout_s: float) -> int | None:
    """Runs one engine to its end with its output in `log_path`; the exit status, None when it
    outlived `timeout_s` (then its whole process group is killed)."""
    process = launch(argv, cpus, log_path)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def measure(engine: str, dtype: str, spec: dict, args: argparse.Namespace, cpus: tuple[int, ...]) -> dict:
    """One engine at one dtype: its figures, or why there are none."""
    try:
        vllm_script = peer_script(args.peer_vllm, "--peer-vllm") if engine == "vllm" else None
    except SystemUnavailable as error:
        return {"status": "skipped", "note": str(error)}
    name = f"{engine}_{dtype}"
    logs = args.result_dir.resolve() / "logs"
    spec_path, result_path = logs / f"{name}_spec.json", logs / f"{name}.json"
    spec_path.write_text(json.dumps({**spec, "dtype": dtype}))
    result_path.unlink(missing_ok=True)
    argv = engine_argv(engine, spec_path, result_path, vllm_script)
    log_path = logs / f"{name}.log"
    logger.info("%s %s: %s", engine, dtype, " ".join(argv))
    exit_status = run_engine(argv, cpus, log_path, args.timeout_s)
    if exit_status != 0 or not result_path.is_file():
        reason = f"timed out after {args.timeout_s:g} s" if exit_status is None else f"exit status {exit_status}"
        return {"status": "failed", "note": f"{reason}; see logs/{log_path.name}"}
    run = json.loads(result_path.read_text())
    seconds = statistics.median(run["timed_s"])
    logger.info("%s %s: median %.2f s over %d timed runs", engine, dtype, seconds, len(run["timed_s"]))
    return {"status": "ok", "seconds": seconds, **run,
            "output_tok_per_s": run["num_output_tokens"] / seconds,
            "total_tok_per_s": (run["num_prompt_tokens"] + run["num_output_tokens"]) / seconds}


def num_same_outputs(results: dict[str, dict]) -> int | None:
    """How many prompts got the same greedy tokens from both engines (None unless both ran)."""
    if any(results.get(engine, {}).get("status") != "ok" for engine in ENGINES):
        return None
    pairs = zip(results["pdserve"]["output_token_ids"], results["vllm"]["output_token_ids"])
    return sum(mine == theirs for mine, theirs in pairs)


def run_offline(args: argparse.Namespace, cpus: tuple[int, ...]) -> dict:
    from transformers import AutoTokenizer

    from pdserve.bench.datasets import make_dataset
    from pdserve.checkpoints.model_ref import resolve_model

    machine = machine_summary()
    model_dir = resolve_model(args.model, os.environ).model_dir.resolve()
    requests = make_dataset("prompt-heavy", num_prompts=args.num_prompts, seed=args.seed,
                            output_len=args.output_len, tokenizer=AutoTokenizer.from_pretrained(str(model_dir)))
    prompt_token_ids = [request.prompt_token_ids for request in requests]
    spec = {"model": str(model_dir), "prompt_token_ids": prompt_token_ids, "output_len": args.output_len,
            "num_timed_runs": args.num_runs}
    (args.result_dir / "logs").mkdir(parents=True, exist_ok=True)
    combined = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": ["pdserve", *sys.argv[1:]],
        "model": model_summary(model_dir),
        "workload": {"dataset": "prompt-heavy", "num_prompts": args.num_prompts, "output_len": args.output_len,
                     "seed": args.seed, "ignore_eos": True, "temperature": 0.0, "num_warmup_runs": 1,
                     "num_timed_runs": args.num_runs,
                     "input_lens": length_summary([len(ids) for ids in prompt_token_ids])},
        "cpus": list(cpus), "num_threads": len(cpus), "machine": machine,
        "versions": versions(None),  # vLLM's comes with its runs
        "dtypes": {},
    }
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
    parser.add_argument("--model", metavar="SPEC",
                        help="what `pdserve up --model` takes (default: SmolLM2-135M-Instruct, fetched once)")
    parser.add_argument("--peer-vllm", type=Path, metavar="SCRIPT",
                        help="script whose `python ARGS` runs the peer's python with vLLM; without it, pdserve alone")
    parser.add_argument("--dtypes", type=_dtypes, default=DTYPES, metavar="LIST",
                        help=f"comma-separated, from {','.join(DTYPES)} (default: both)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-runs", type=int, default=3, help="timed runs after the warm-up (default 3)")
    parser.add_argument("--cpus", type=parse_cpu_list, default=None, metavar="LIST",
                        help="CPUs both engines are pinned to, one thread each (default: every usable CPU)")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per engine and dtype (default 1800)")
    parser.add_argument("--result-dir", type=Path, default=Path("bench/results/offline"))


def _dtypes(text: str) -> tuple[str, ...]:
    dtypes = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if not dtypes or any(dtype not in DTYPES for dtype in dtypes):
        raise argparse.ArgumentTypeError(f"--dtypes takes names from {','.join(DTYPES)}, got {text!r}")
    return dtypes


def run(args: argparse.Namespace) -> int:
    if args.num_prompts < 1 or args.output_len < 1 or args.num_runs < 1:
        raise SystemExit("pdserve bench offline: --num-prompts, --output-len and --num-runs must be at least 1")
    cpus = args.cpus or all_cpus()
    logger.info("engines on CPUs %s with %d thread(s)", cpus, len(cpus))
    combined = run_offline(args, cpus)
    print(args.result_dir / RESULT_JSON_NAME)
    return 0 if all(result["status"] != "failed" for entry in combined["dtypes"].values()
                    for result in entry["engines"].values()) else 1
