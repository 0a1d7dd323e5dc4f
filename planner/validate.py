"""Predicted against measured: the planner's simulation beside `pdserve bench` on the same trace.

For each configuration this machine can run (xPyD with one CPU per replica) and each request
rate, a trace is sent through the benchmark's runner `num_repeats` times (round robin over the
points, so that each point's runs spread over the whole validation), each time to a system
launched afresh (planner/bench_runs.py) and with fresh prompts of the same lengths (so that no
run hits the prefix cache): the machine is shared and one run can be far off, and where the
scheduler puts the floating front (gateway, Redis, client) differs from one start to the next.
The simulation gets each run's trace: each request's send time and its prompt and output
lengths, nothing the system measured; its figures for a trace are the medians over `NUM_DRAWS`
seeds of its jitter draws, so that a few drawn outliers do not set one trace's tail. A row pairs
the medians over the repeats of each percentile and of the goodput, with predicted / measured
ratios, and keeps every repeat's figures, predicted and measured (so that what the traces
explain of the runs' spread shows); it is within tolerance when every TTFT and TPOT ratio is.
Each run's CPU (planner/proc_cpu.py) is read too: the front's is set beside the front's work the
simulation ran (planner/cpu_sharing.py), a check of the sharing's input, not a figure the
prediction uses; the replicas' are kept with the run's figures. A speed probe
(planner/speed.py) is read before and after each run, with the system idle; where the profile
has a reference time too, each row also carries the prediction at each run's speed
(`at_speed`): the profile scaled to the machine's speed around that run. So does the served
speed (planner/served_speed.py), read through the idle system around each run
(`at_served_speed`).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.records import RequestRecord
from pdserve.bench.runner import BenchResult
from pdserve.planner.bench_runs import bench, launched, random_requests
from pdserve.planner.proc_cpu import cpu_during
from pdserve.planner.profile import Profile
from pdserve.planner.simulate import RequestTimes, SimSummary, XpYd, simulate
from pdserve.planner.served_speed import anchor_shape, anchor_ttft_s, profile_anchor_ttft_s
from pdserve.planner.speed import SpeedProbe, at_speed, scaled
from pdserve.planner.workload import SimRequest, Slo

TOLERANCE = 0.25
NUM_DRAWS = 5
COMPARED = ("p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "p90_tpot_ms")
ANCHOR_SEED = 5000  # apart from the runs' seeds


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
    runs = {point: [] for point in points}  # each point's runs: (result, CPU s/s by part, reference, scale)
    anchor = anchor_shape(config.profile)
    with SpeedProbe(config.model_dir) as probe:
        # round robin, so that each point's runs spread over the whole validation as the machine drifts
        for repeat in range(config.num_repeats):
            for point in points:
                runs[point].append(_run(config, probe, anchor, *point, repeat))
    rows = []
    for (xpyd, _, rate), point_runs in runs.items():
        results, cpu_s_per_s, references_s, served_scales = map(list, zip(*point_runs))
        rows.append({**compare_row(config.profile, xpyd, rate, [result.records for result in results], config.slo,
                                   cpu_s_per_s, references_s, served_scales if anchor else None),
                     "load_average_1m": os.getloadavg()[0]})
    return rows


def _run(config: ValidationConfig, probe: SpeedProbe, anchor: tuple[int, int] | None, xpyd: XpYd, index: int,
         rate: float, repeat: int) -> tuple[BenchResult, dict[str, float], float, float | None]:
    """One run on a system launched afresh, with the speed probe and the served speed
    (planner/served_speed.py; none without an anchor) read around it while the system is idle."""
    # fresh prompts each run: the same ones again would hit the prefix cache
    seed = config.seed + index * config.num_repeats + repeat
    requests = random_requests(config.model_dir, config.num_prompts, config.input_len, config.output_len, seed,
                               config.range_ratio)
    with launched(config.model_dir, xpyd.num_decode, config.log_dir / f"{xpyd}.log", dtype=config.dtype) as system:
        base_url = system.spec.base_url
        bench(base_url, random_requests(config.model_dir, 4, config.input_len, 8, config.seed + 999), "warm-up",
              progress=False)
        before_s = probe.read_s()
        anchors_s = [anchor_ttft_s(base_url, config.model_dir, anchor, ANCHOR_SEED + 2 * seed)] if anchor else []
        result, cpu_s, wall_s = cpu_during(system.pid, lambda: bench(
            base_url, requests, f"{xpyd} rate {rate:g} run {repeat + 1}", request_rate=rate, seed=seed,
            goodput_slos_ms={"ttft": config.slo.ttft_ms, "tpot": config.slo.tpot_ms}))
        if anchor:
            anchors_s.append(anchor_ttft_s(base_url, config.model_dir, anchor, ANCHOR_SEED + 2 * seed + 1))
        reference_s = (before_s + probe.read_s()) / 2
    served_scale = statistics.mean(anchors_s) / profile_anchor_ttft_s(config.profile) if anchors_s else None
    return result, {part: seconds / wall_s for part, seconds in cpu_s.items()}, reference_s, served_scale


def compare_row(profile: Profile, xpyd: XpYd, rate: float, runs: list[list[RequestRecord]], slo: Slo,
                cpu_s_per_s: list[dict[str, float]] | None = None, references_s: list[float] | None = None,
                served_scales: list[float] | None = None) -> dict:
    """`runs`: each run's records; `cpu_s_per_s`: each run's measured CPU seconds per second by part (planner/proc_cpu.py's
    `system_cpu_s` keys), when read; `references_s`: each run's reference time (planner/speed.py)
    and `served_scales` its served speed (planner/served_speed.py), when read, each for a
    prediction at each run's speed beside the one at the profile's."""
    traces, measured_runs = [], []
    for index, records in enumerate(runs):
        traces.append([SimRequest(r.start_s, r.prompt_len, r.output_len) for r in records])
        measured_runs.append(SimSummary.of(
            [RequestTimes(r.start_s, r.start_s + r.ttft_s, r.start_s + r.e2el_s, r.output_len) for r in records],
            slo).to_dict())
        if cpu_s_per_s is None:
            del measured_runs[-1]["front_cpu_s_per_s"]
        else:
            measured_runs[-1]["front_cpu_s_per_s"] = cpu_s_per_s[index]["front"]
            measured_runs[-1]["cpu_s_per_s"] = cpu_s_per_s[index]
    predicted_runs = [_predicted(profile, xpyd, trace, slo) for trace in traces]
    predicted, measured = _medians(predicted_runs), _medians(measured_runs)
    row = {"config": str(xpyd), "request_rate": rate, "num_requests": len(runs[0]),
           "num_repeats": len(runs), "predicted": predicted, "measured": measured,
           **_compared(predicted, measured), "predicted_runs": predicted_runs, "measured_runs": measured_runs,
           # each run's trace and times, for planner/replay.py
           "records": [[[r.start_s, r.prompt_len, r.output_len, r.ttft_s, r.e2el_s] for r in records]
                       for records in runs]}
    if references_s is not None:
        row["at_speed"] = {"references_s": references_s, "profile_reference_s": profile.hardware.get("reference_s"),
                           **_at([at_speed(profile, s) for s in references_s], xpyd, traces, slo, measured)}
    if served_scales is not None:
        row["at_served_speed"] = {"scales": served_scales, "profile_anchor_ttft_s": profile_anchor_ttft_s(profile),
                                  **_at([scaled(profile, s) for s in served_scales], xpyd, traces, slo, measured)}
    return row


def _at(profiles: list[Profile], xpyd: XpYd, traces: list[list[SimRequest]], slo: Slo, measured: dict) -> dict:
    """Each run's trace predicted with its own profile, against the measured medians."""
    predicted = _medians([_predicted(p, xpyd, trace, slo) for p, trace in zip(profiles, traces)])
    return {"predicted": predicted, **_compared(predicted, measured)}


def _predicted(profile: Profile, xpyd: XpYd, trace: list[SimRequest], slo: Slo) -> dict:
    return _medians([simulate(profile, xpyd, trace, slo, seed=seed).to_dict() for seed in range(NUM_DRAWS)])


def _compared(predicted: dict, measured: dict) -> dict:
    ratios = {key: predicted[key] / measured[key] for key in COMPARED if measured[key] > 0}
    return {"ratios": ratios, "within_tolerance": all(abs(ratio - 1) <= TOLERANCE for ratio in ratios.values())}


def _medians(runs: list[dict]) -> dict:
    """Each figure's median over the runs (the figures held as dicts, by part, too)."""
    return {key: _medians([run[key] for run in runs]) if isinstance(runs[0][key], dict)
            else statistics.median(run[key] for run in runs) for key in runs[0]}
