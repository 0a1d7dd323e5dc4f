"""Predicted against measured: the planner's simulation beside `pdserve bench` on the same trace.

For each configuration this machine can run (xPyD with one CPU per replica) and each request
rate, a trace is sent through the benchmark's runner `num_repeats` times, round robin over the
points (so that each point's runs spread over the whole validation as the machine drifts), each
time to a system launched afresh (planner/bench_runs.py; where the scheduler puts the floating
front differs from one start to the next) and with fresh prompts of the same lengths (the same
ones again would hit the prefix cache). The simulation gets each run's trace: each request's
send time and its prompt and output lengths, nothing the system measured. A row pairs the
medians over the repeats of each percentile and of the goodput, with predicted / measured
ratios, and keeps every repeat's figures, predicted and measured; it is within tolerance when
every TTFT and TPOT ratio is.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.records import RequestRecord
from pdserve.planner.bench_runs import bench, launched, random_requests
from pdserve.planner.profile import Profile
from pdserve.planner.simulate import XpYd, simulate
from pdserve.planner.summary import RequestTimes, SimSummary
from pdserve.planner.workload import SimRequest, Slo

TOLERANCE = 0.25
COMPARED = ("p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "p90_tpot_ms")


@dataclass(frozen=True, slots=True)
class ValidationConfig:
    profile: Profile
    model_dir: Path
    configs: tuple[XpYd, ...]
    request_rates: tuple[float, ...]
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float
    slo: Slo
    log_dir: Path
    seed: int = 0
    dtype: str = "float32"
    num_repeats: int = 3


def check_runnable(config: XpYd) -> None:
    """`pdserve bench-compare`'s disaggregated system has one prefill replica, and the profile
    measured a replica alone on its CPUs: replicas sharing a core are outside it."""
    if config.num_prefill != 1:
        raise ValueError(f"{config}: the measured system runs one prefill replica")
    if config.num_gpus > len(os.sched_getaffinity(0)):
        raise ValueError(f"{config}: {config.num_gpus} replicas on {len(os.sched_getaffinity(0))} CPUs "
                         "would share cores")


def validate(config: ValidationConfig) -> list[dict]:
    for xpyd in config.configs:
        check_runnable(xpyd)
    points = [(xpyd, index, rate) for xpyd in config.configs for index, rate in enumerate(config.request_rates)]
    runs: dict[tuple, list[list[RequestRecord]]] = {point: [] for point in points}
    for repeat in range(config.num_repeats):
        for point in points:
            runs[point].append(_run(config, *point, repeat))
    return [compare_row(config.profile, xpyd, rate, point_runs, config.slo)
            for (xpyd, _, rate), point_runs in runs.items()]


def _run(config: ValidationConfig, xpyd: XpYd, index: int, rate: float, repeat: int) -> list[RequestRecord]:
    """One run's records, on a system launched afresh."""
    seed = config.seed + index * config.num_repeats + repeat  # fresh prompts each run
    requests = random_requests(config.model_dir, config.num_prompts, config.input_len, config.output_len, seed,
                               config.range_ratio)
    with launched(config.model_dir, xpyd.num_decode, config.log_dir / f"{xpyd}.log", dtype=config.dtype) as system:
        base_url = system.spec.base_url
        bench(base_url, random_requests(config.model_dir, 4, config.input_len, 8, config.seed + 999), "warm-up",
              progress=False)
        return bench(base_url, requests, f"{xpyd} rate {rate:g} run {repeat + 1}", request_rate=rate, seed=seed,
                     goodput_slos_ms={"ttft": config.slo.ttft_ms, "tpot": config.slo.tpot_ms}).records


def compare_row(profile: Profile, xpyd: XpYd, rate: float, runs: list[list[RequestRecord]], slo: Slo) -> dict:
    """`runs`: each run's records; each run's trace simulated beside it."""
    measured_runs, predicted_runs = [], []
    for records in runs:
        times = [RequestTimes(r.start_s, r.start_s + r.ttft_s, r.start_s + r.e2el_s, r.output_len) for r in records]
        measured_runs.append(SimSummary.of(times, slo).to_dict())
        trace = [SimRequest(r.start_s, r.prompt_len, r.output_len) for r in records]
        predicted_runs.append(simulate(profile, xpyd, trace, slo).to_dict())
    predicted, measured = _medians(predicted_runs), _medians(measured_runs)
    ratios = {key: predicted[key] / measured[key] for key in COMPARED if measured[key] > 0}
    return {"config": str(xpyd), "request_rate": rate, "num_requests": len(runs[0]), "num_repeats": len(runs),
            "predicted": predicted, "measured": measured, "ratios": ratios,
            "within_tolerance": all(abs(ratio - 1) <= TOLERANCE for ratio in ratios.values()),
            "predicted_runs": predicted_runs, "measured_runs": measured_runs}


def _medians(runs: list[dict]) -> dict:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}
