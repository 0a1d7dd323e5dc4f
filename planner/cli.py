"""`pdserve plan`: profile a model on this device, simulate xPyD configurations, recommend a split.

    pdserve plan profile   --model DIR --out profile.json      # on the CPUs taskset gives it
    pdserve plan simulate  --profile profile.json --config 1P1D --config 2P6D --request-rate 4 ...
    pdserve plan recommend --profile profile.json --gpus 8,16,32 --rate-per-gpu 3 ... --result-dir DIR

Tables go to stdout; with `--result-dir`, JSON and markdown too (and recommend's PNG).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdserve.bench.datasets import DATASET_KINDS

SIZES = ("prefill_prompt_lens", "prefill_num_seqs", "decode_num_seqs", "decode_context_lens")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Capacity planning for prefill/decode disaggregation: measured step-time profiles, a "
                          "discrete-event simulation of xPyD serving, the recommended P:D split.")
    steps = parser.add_subparsers(dest="plan_command", metavar="STEP", required=True)
    profile = steps.add_parser("profile", help="measure the engine's step times and KV copy bandwidth")
    profile.add_argument("--model", type=Path, required=True, metavar="DIR")
    profile.add_argument("--out", type=Path, default=Path("bench/results/plan/profile.json"))
    profile.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    profile.add_argument("--dtype", default="float32", help="the replicas' dtype")
    profile.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1: a replica per core)")
    profile.add_argument("--repeats", type=int, default=5, help="timed steps per point")
    profile.add_argument("--max-num-batched-tokens", type=int, default=2048)
    for sizes in SIZES:
        profile.add_argument(f"--{sizes.replace('_', '-')}", type=_ints, metavar="LIST")
    simulate = steps.add_parser("simulate", help="predict TTFT, TPOT and goodput of xPyD configurations")
    simulate.add_argument("--config", action="append", type=_xpyd, required=True, metavar="xPyD",
                          help="e.g. 1P1D; repeat for more")
    recommend = steps.add_parser("recommend", help="the best P:D split of each GPU budget (table and plot)")
    recommend.add_argument("--gpus", type=_ints, default=(8, 16, 32), metavar="LIST", help="default 8,16,32")
    recommend.add_argument("--rate-per-gpu", type=float, help="the fleet's rate: this times its GPUs")
    for step in (simulate, recommend):
        step.add_argument("--profile", type=Path, required=True, metavar="JSON")
        step.add_argument("--request-rate", type=float, required=step is simulate, help="requests/s (inf: all at once)")
        step.add_argument("--num-prompts", type=int, default=500)
        step.add_argument("--dataset", choices=DATASET_KINDS, default="random")
        step.add_argument("--input-len", type=int, default=256)
        step.add_argument("--output-len", type=int, default=64)
        step.add_argument("--range-ratio", type=float, default=0.0)
        step.add_argument("--seed", type=int, default=0)
        step.add_argument("--ttft-slo-ms", type=float, required=True)
        step.add_argument("--tpot-slo-ms", type=float, required=True)
        step.add_argument("--result-dir", type=Path, help="write JSON and markdown here")


def run(args: argparse.Namespace) -> int:
    if args.plan_command == "profile":
        return _profile(args)
    from pdserve.bench.metrics import validate_slos
    from pdserve.planner.profile import Profile

    try:
        profile = Profile.load(args.profile)
    except ValueError as error:
        raise SystemExit(f"pdserve plan: {args.profile}: {error}") from error
    slos_ms = {"ttft": args.ttft_slo_ms, "tpot": args.tpot_slo_ms}
    validate_slos(slos_ms)
    figures, markdown = (_simulate if args.plan_command == "simulate" else _recommend)(args, profile, slos_ms)
    print(markdown)
    if args.result_dir is not None:
        name = "simulate" if args.plan_command == "simulate" else "fleet"
        args.result_dir.mkdir(parents=True, exist_ok=True)
        (args.result_dir / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")
        (args.result_dir / f"{name}.md").write_text(markdown)
        print(args.result_dir / f"{name}.json")
    return 0


def _profile(args: argparse.Namespace) -> int:
    from pdserve.planner.measure import MeasureConfig, measure_profile

    sizes = {name: getattr(args, name) for name in SIZES if getattr(args, name)}
    config = MeasureConfig(model_dir=args.model, device=args.device, dtype=args.dtype, threads=args.threads,
                           max_num_batched_tokens=args.max_num_batched_tokens, repeats=args.repeats, **sizes)
    print(measure_profile(config).save(args.out))
    return 0


def _simulate(args: argparse.Namespace, profile, slos_ms: dict[str, float]) -> tuple[dict, str]:
    from pdserve.planner.report import simulation_markdown
    from pdserve.planner.simulate import simulate

    workload = _workload(args, args.request_rate)
    requests = workload.requests()
    rows = [{"config": str(config), **simulate(profile, config, requests, slos_ms)} for config in args.config]
    return ({"workload": workload.to_dict(), "slos_ms": slos_ms, "profile": str(args.profile), "rows": rows},
            simulation_markdown(rows))


def _recommend(args: argparse.Namespace, profile, slos_ms: dict[str, float]) -> tuple[dict, str]:
    """Also writes fleet.png with a result dir."""
    from pdserve.planner.recommend import pick, sweep_splits
    from pdserve.planner.report import fleet_markdown, plot_fleet

    if (args.request_rate is None) == (args.rate_per_gpu is None):
        raise SystemExit("pdserve plan recommend: give --request-rate or --rate-per-gpu")
    fleets = []
    for num_gpus in args.gpus:
        workload = _workload(args, args.request_rate or args.rate_per_gpu * num_gpus)
        candidates = sweep_splits(profile, num_gpus, workload, slos_ms)
        fleets.append({"num_gpus": num_gpus, "request_rate": workload.request_rate, "workload": workload.to_dict(),
                       "recommended": pick(candidates, slos_ms), "candidates": candidates})
    fleet = {"profile": {"path": str(args.profile), "hardware": profile.hardware, "model": profile.model},
             "slos_ms": slos_ms, "fleets": fleets}
    if args.result_dir is not None:
        args.result_dir.mkdir(parents=True, exist_ok=True)
        print(plot_fleet(fleet, args.result_dir / "fleet.png"))
    return fleet, fleet_markdown(fleet)


def _workload(args: argparse.Namespace, rate: float):
    from pdserve.planner.simulate import Workload
    return Workload(request_rate=rate, num_requests=args.num_prompts, input_len=args.input_len,
                    output_len=args.output_len, range_ratio=args.range_ratio, dataset=args.dataset, seed=args.seed)


def _xpyd(text: str):
    from pdserve.planner.simulate import XpYd
    return XpYd.parse(text)  # argparse reports its ValueError


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))
