"""The engine as a replica runs it, and what the serving path adds, measured through `pdserve up`.

Three kinds of profile runs on a 1P1D system, none of them a validation workload:
1. One request at a time at a few prompt and output lengths, `single_gap_s` apart (nearly
   regular arrivals, concurrency 1), so each finds the system idle, its predecessor's clean-up
   (KV release, Redis writes) done, as a request of a light load does.
2. Waves of requests sent at once, of a few shapes (`wave_shapes`: batch, prompt and output
   lengths). The gateway takes a wave's requests one at a time and the prefill steps of short
   prompts overlap it: the slope of the wave's sorted TTFTs against their rank is an upper bound
   on the gateway's time per request, the least of the shapes' (median) slopes its estimate (a
   slope, not the last TTFT, so that one stall of a shared machine does not set it). Decode runs
   a wave as one batch (the CPU readings below use the waves; the TPOT calibration does not).
3. Staggered runs of a few shapes (`staggered_shapes`: requests in flight, prompt and output
   lengths), arriving regularly at the rate that keeps that many in flight at the singles'
   latency: requests joining and leaving a running batch of a few, as under a moderate load.

The overheads are what these runs took beyond what the simulation (planner/simulate.py) gives
the same traces with the engine's fits, the CPU beside them and no overheads, so that the
simulation, given them back, reproduces the runs. Per single, TTFT beyond the simulated one is
the idle TTFT overhead (the gateway's share of it, the rest after it); E2EL - TTFT beyond the
simulated decode span is regressed on the number of decode steps: the slope is the overhead of a
step at batch 1, the intercept the handoff (reserve, commit, join). The overhead per step and
running request beyond the first is what gives the staggered runs, simulated with all of that,
their measured median TPOTs (`_per_seq_step_s`): read where requests overlap as they do under a
load, not from waves, whose many streams at once cost more per request than a few do.
Medians throughout, since the machine is shared; the spreads are kept as samples: each staggered
request's TTFT less what the simulation, given all of the above, gives it (`ttft_delays_s`: a
light load's spread on the TTFT path, which requests alone do not show, and the part of its
median the CPU sharing does not explain), each single's decode span less the regression line
(`handoff_residuals_s`).

The CPU beside the engines (planner/cpu_sharing.py) is read around each of those runs
(planner/proc_cpu.py): the front's, and each replica's beyond its engine thread; first over
`idle_window_s` with no requests (the idle CPU seconds per second), then per run. What each run
took beyond the idle rate is regressed (non-negative least squares of the absolute error) on its
requests, output tokens and decode steps (the front's and the decode replica's), or on its
requests alone (the prefill replica's, which streams no tokens). A single request's decode
steps are its output tokens less one; a wave's are its length less one plus the steps over
which its prompts join (`_num_decode_steps`).

The engine's own fits (planner/measure.py) time it alone in this process; inside a replica its
thread costs otherwise (the prefill's KV copy runs there, layer by layer; the decode's gRPC and
asyncio threads share its core and its caches). So the replicas' engine-thread CPU over the same
runs resets them: the prefill fit is scaled by that CPU over what the fit gives for the runs'
prompts, and the decode fit's intercept and per-request terms are refitted to that CPU over the
runs' decode steps (its context term kept), with a term per request joining (the reservation,
commit and join its engine thread runs). The waves' shapes differ in output length, so that a
wave's joins (one per request) and its tokens (output length less one per request) are not in
the same ratio in every run: otherwise the two terms could trade cost for each other.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import numpy as np

from pdserve.bench.metrics import tpot_s
from pdserve.bench.records import RequestRecord
from pdserve.planner.bench_runs import bench, launched, random_requests
from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.proc_cpu import cpu_during
from pdserve.planner.profile import DecodeFit, PrefillFit, Profile, ServingOverhead, fit_linear
from pdserve.planner.simulate import RequestTimes, Simulation, XpYd
from pdserve.planner.workload import SimRequest

REGULAR_ARRIVALS = 1000.0  # gamma shape of the gaps: all within a few % of their mean
SINGLE_GAP_S = 0.6  # between single requests: longer than one takes
GATEWAY_ITERATIONS = 4  # the estimate moves by well under 1 % from the third to the fourth
PER_SEQ_STEP_BOUND_S = 0.05  # far beyond any step's cost per request
BISECTIONS = 20  # to within 0.05 µs


@dataclasses.dataclass(frozen=True, slots=True)
class ServingRunConfig:
    model_dir: Path
    log_dir: Path
    prompt_lens: tuple[int, ...] = (64, 512)
    output_lens: tuple[int, ...] = (8, 64)
    num_repeats: int = 10  # requests per (prompt, output) point: 40 samples of the idle spread
    single_gap_s: float = SINGLE_GAP_S
    wave_shapes: tuple[tuple[int, int, int], ...] = ((16, 64, 64), (8, 256, 32), (4, 64, 128))  # batch, prompt, output
    num_waves: int = 2  # of each shape
    # requests in flight, prompt and output lengths; (prompt, output) among the singles'
    staggered_shapes: tuple[tuple[int, int, int], ...] = ((2, 512, 64), (2, 64, 64), (4, 64, 64))
    num_staggered: int = 32  # requests per staggered run
    num_staggered_runs: int = 3  # of each shape
    idle_window_s: float = 3.0
    dtype: str = "float32"
    seed: int = 1000  # apart from the validation traces' seeds

    def __post_init__(self) -> None:
        singles = {(p, o) for p in self.prompt_lens for o in self.output_lens}
        if any((p, o) not in singles for _, p, o in self.staggered_shapes):
            raise ValueError(f"staggered shapes {self.staggered_shapes} need singles of their lengths")


def measure_serving(profile: Profile, config: ServingRunConfig) -> Profile:
    """`profile` with the engine's fits as served and the serving path's overheads."""
    with launched(config.model_dir, 1, config.log_dir / "serving_profile.log", dtype=config.dtype) as system:
        base_url = system.spec.base_url
        # its own seed: prompts the measured runs repeat would be prefilled from the prefix cache
        bench(base_url, random_requests(config.model_dir, 4, 64, 8, config.seed - 1), "warm-up", progress=False)
        _, idle_cpu_s, idle_s = cpu_during(system.pid, lambda: time.sleep(config.idle_window_s))
        idle_cpu_s_per_s = {part: cpu_s / idle_s for part, cpu_s in idle_cpu_s.items()}
        readings = []

        def run(requests, label: str, batch_size: int, **options) -> list[RequestRecord]:
            """`batch_size`: the requests run one at a time (1) or all in one batch."""
            result, cpu_s, wall_s = cpu_during(system.pid, lambda: bench(base_url, requests, label, **options))
            prompt_len, output_len = len(requests[0].prompt_token_ids), requests[0].output_len
            num_decode_steps = _num_decode_steps(result.records, batch_size)
            readings.append({"label": label, "num_requests": len(requests), "batch_size": batch_size,
                             "prompt_len": prompt_len, "output_len": output_len,
                             "num_output_tokens": len(requests) * output_len,
                             "num_decode_steps": num_decode_steps, "wall_s": wall_s, "cpu_s": cpu_s})
            return result.records

        singles = []
        for prompt_len in config.prompt_lens:
            for output_len in config.output_lens:
                requests = random_requests(config.model_dir, config.num_repeats, prompt_len, output_len,
                                           config.seed + len(singles))
                singles.append(run(requests, f"single p{prompt_len} o{output_len}", 1, max_concurrency=1,
                                   request_rate=1 / config.single_gap_s, burstiness=REGULAR_ARRIVALS))
        waves = []
        for batch_size, prompt_len, output_len in config.wave_shapes:
            for _ in range(config.num_waves):
                requests = random_requests(config.model_dir, batch_size, prompt_len, output_len,
                                           config.seed + 100 + len(waves))
                waves.append(run(requests, f"wave of {batch_size} p{prompt_len} o{output_len}", batch_size))
        single_e2el_s = {(run[0].prompt_len, run[0].output_len): statistics.median(r.e2el_s for r in run)
                         for run in singles}
        staggered = []
        for in_flight, prompt_len, output_len in config.staggered_shapes:
            for _ in range(config.num_staggered_runs):
                requests = random_requests(config.model_dir, config.num_staggered, prompt_len, output_len,
                                           config.seed + 200 + len(staggered))
                rate = in_flight / single_e2el_s[prompt_len, output_len]  # Little's law, at idle latency
                staggered.append(bench(base_url, requests, f"staggered {in_flight} p{prompt_len} o{output_len}",
                                       request_rate=rate, burstiness=REGULAR_ARRIVALS).records)
    served = dataclasses.replace(profile, prefill=served_prefill_fit(profile.prefill, readings),
                                 decode=served_decode_fit(profile.decode, readings),
                                 serving=ServingOverhead(cpu=sharing_from_readings(idle_cpu_s_per_s, readings)))
    overhead = overhead_from_records(served, singles, waves, staggered)
    return dataclasses.replace(served, serving=dataclasses.replace(
        overhead, cpu_samples=[{"label": "idle", "cpu_s_per_s": idle_cpu_s_per_s}, *readings],
        engine_alone={"prefill": dataclasses.asdict(profile.prefill), "decode": dataclasses.asdict(profile.decode)}))


def served_prefill_fit(alone: PrefillFit, readings: list[dict]) -> PrefillFit:
    """`alone` scaled by the prefill engine thread's CPU over what `alone` gives for the prompts
    of the single-request runs, each prefilled in a step of its own (a wave's prompts reach the
    prefill one by one from the gateway, in steps of unknown make-up)."""
    singles = [r for r in readings if r["batch_size"] == 1]
    fitted_s = sum(r["num_requests"] * alone.step_s([(0, r["prompt_len"])]) for r in singles)
    scale = sum(r["cpu_s"]["prefill_engine"] for r in singles) / fitted_s
    return PrefillFit(alone.intercept_s * scale, alone.per_token_s * scale, alone.per_attention_pair_s * scale)


def served_decode_fit(alone: DecodeFit, readings: list[dict]) -> DecodeFit:
    """`alone`'s intercept and per-request terms, and a term per request joining, fitted to the
    decode engine thread's CPU over the runs' decode steps, its context term kept. A run's
    tokens decoded and the context they read are exact, a wave's number of steps an estimate
    (`_num_decode_steps`)."""
    features, targets = [], []
    for r in readings:
        context_tokens = r["num_requests"] * sum(r["prompt_len"] + generated for generated in range(1, r["output_len"]))
        features.append([r["num_decode_steps"], r["num_requests"] * (r["output_len"] - 1), r["num_requests"]])
        targets.append(r["cpu_s"]["decode_engine"] - alone.per_context_token_s * context_tokens)
    intercept_s, per_seq_s, per_join_s = fit_linear(features, targets, relative=False)
    return DecodeFit(intercept_s, per_seq_s, alone.per_context_token_s, per_join_s)


def sharing_from_readings(idle_cpu_s_per_s: dict[str, float], readings: list[dict]) -> CpuSharing:
    """`pdserve up` pins the replicas to the CPUs the front floats over, so they share them."""
    return CpuSharing(shares_replica_cpus=True,
                      front=demand_from_readings("front", idle_cpu_s_per_s["front"], readings),
                      prefill=demand_from_readings("prefill", idle_cpu_s_per_s["prefill"], readings,
                                                   features=("num_requests",)),
                      decode=demand_from_readings("decode", idle_cpu_s_per_s["decode"], readings))


def demand_from_readings(part: str, idle_cpu_s_per_s: float, readings: list[dict],
                         features: tuple[str, ...] = ("num_requests", "num_output_tokens", "num_decode_steps")
                         ) -> CpuDemand:
    """One part's CPU per request (and per output token and decode step), from runs' CPU seconds
    beyond its idle rate."""
    coefficients = fit_linear([[r[feature] for feature in features] for r in readings],
                              [r["cpu_s"][part] - idle_cpu_s_per_s * r["wall_s"] for r in readings], relative=False)
    per_feature = dict(zip(features, coefficients))
    return CpuDemand(idle_s_per_s=idle_cpu_s_per_s, per_request_s=per_feature["num_requests"],
                     per_output_token_s=per_feature.get("num_output_tokens", 0.0),
                     per_decode_step_s=per_feature.get("num_decode_steps", 0.0))


def overhead_from_records(profile: Profile, singles: list[list[RequestRecord]], waves: list[list[RequestRecord]],
                          staggered: list[list[RequestRecord]]) -> ServingOverhead:
    """The overheads beyond what the simulation gives each run's trace under `profile` (its fits
    and its CPU sharing; its overheads are not read): `singles`, `waves` and `staggered`, one
    list of records per run, each record's `start_s` from its run's start."""
    bare = dataclasses.replace(profile, serving=ServingOverhead(cpu=profile.serving.cpu),
                               prefill_samples=[], decode_samples=[])  # the median model
    single_records = [r for run in singles for r in run]
    simulated = [t for run in singles for t in _simulated(bare, run)]
    idle_overheads_s = [max(0.0, r.ttft_s - t.ttft_s) for r, t in zip(single_records, simulated)]
    idle_ttft_s = statistics.median(idle_overheads_s)
    gateway_s = _gateway_s(bare, waves, idle_ttft_s)
    ttft_s = idle_ttft_s - gateway_s
    num_steps = [r.output_len - 1 for r in single_records]
    beyond_s = [(r.e2el_s - r.ttft_s) - (t.finish_s - t.first_token_s) for r, t in zip(single_records, simulated)]
    # the per-step overhead at batch 1; the handoff
    step_s, intercept_s = np.polyfit(num_steps, beyond_s, 1)
    handoff_residuals_s = [float(b - (step_s * n + intercept_s)) for n, b in zip(num_steps, beyond_s)]
    at_batch_1 = dataclasses.replace(bare, serving=dataclasses.replace(
        bare.serving, gateway_s=gateway_s, ttft_s=ttft_s, handoff_s=max(0.0, float(intercept_s)),
        step_s=max(0.0, float(step_s))))
    samples = [{"kind": "single", "prompt_len": r.prompt_len, "output_len": r.output_len,
                "ttft_s": r.ttft_s, "e2el_s": r.e2el_s} for r in single_records]
    samples += [{"kind": kind, "num_requests": len(records), "prompt_len": r.prompt_len, "output_len": r.output_len,
                 "start_s": r.start_s, "ttft_s": r.ttft_s, "e2el_s": r.e2el_s}
                for kind, runs in (("wave", waves), ("staggered", staggered)) for records in runs for r in records]
    calibrated = dataclasses.replace(at_batch_1, serving=dataclasses.replace(
        at_batch_1.serving, per_seq_step_s=_per_seq_step_s(at_batch_1, staggered)))
    return dataclasses.replace(calibrated.serving, ttft_delays_s=_ttft_delays_s(calibrated, staggered),
                               handoff_residuals_s=handoff_residuals_s, samples=samples)


def _ttft_delays_s(calibrated: Profile, staggered: list[list[RequestRecord]]) -> list[float]:
    """Each staggered request's TTFT less what the simulation gives it under `calibrated`, the
    median model with every other overhead in: the singles' own spread is in these too, so they
    replace it."""
    return [r.ttft_s - t.ttft_s for records in staggered for r, t in zip(records, _simulated(calibrated, records))]


def _per_seq_step_s(at_batch_1: Profile, staggered: list[list[RequestRecord]]) -> float:
    """The overhead per running request beyond the first, per decode step, that gives the
    staggered runs, simulated under `at_batch_1` with it, their measured median TPOTs summed:
    found by bisection, no less than takes the served step's per-request slope to 0."""
    measured_s = sum(statistics.median(tpot_s(r) for r in records) for records in staggered)

    def simulated_s(per_seq_step_s: float) -> float:
        trial = dataclasses.replace(at_batch_1, serving=dataclasses.replace(
            at_batch_1.serving, per_seq_step_s=per_seq_step_s))
        return sum(statistics.median(t.tpot_s for t in _simulated(trial, records)) for records in staggered)

    low_s, high_s = -at_batch_1.decode.per_seq_s, PER_SEQ_STEP_BOUND_S
    for _ in range(BISECTIONS):
        middle_s = (low_s + high_s) / 2
        low_s, high_s = (middle_s, high_s) if simulated_s(middle_s) < measured_s else (low_s, middle_s)
    return (low_s + high_s) / 2


def _gateway_s(bare: Profile, waves: list[list[RequestRecord]], idle_ttft_s: float) -> float:
    """The gateway's work per request that gives the simulated waves the measured waves' least
    TTFT slope (`_least_slope_s`), found by `GATEWAY_ITERATIONS` proportional corrections from
    the measured slope itself; within [0, `idle_ttft_s`], the idle TTFT overhead it is part of."""
    measured_s = _least_slope_s(waves, [[r.ttft_s for r in records] for records in waves])
    gateway_s = min(max(0.0, measured_s), idle_ttft_s)
    for _ in range(GATEWAY_ITERATIONS):
        trial = dataclasses.replace(bare, serving=dataclasses.replace(
            bare.serving, gateway_s=gateway_s, ttft_s=idle_ttft_s - gateway_s))
        simulated_s = _least_slope_s(waves, [[t.ttft_s for t in _simulated(trial, records)] for records in waves])
        if simulated_s <= 0 or gateway_s == 0:
            break
        gateway_s = min(max(0.0, gateway_s * measured_s / simulated_s), idle_ttft_s)
    return gateway_s


def _least_slope_s(waves: list[list[RequestRecord]], ttfts_s: list[list[float]]) -> float:
    """The least, over the waves' shapes (batch, prompt and output lengths), of the median slope
    of a wave's sorted TTFTs (`ttfts_s`, one list per wave) against their rank: the shape where
    the gateway, not the prefill, sets the pace."""
    slopes_s: dict[tuple[int, int, int], list[float]] = {}
    for records, ttfts in zip(waves, ttfts_s):
        shape = (len(records), records[0].prompt_len, records[0].output_len)
        slopes_s.setdefault(shape, []).append(float(np.polyfit(range(len(ttfts)), sorted(ttfts), 1)[0]))
    return min(statistics.median(slopes) for slopes in slopes_s.values())


def _simulated(profile: Profile, records: list[RequestRecord]) -> list[RequestTimes]:
    """What the simulation gives one run's trace, on the 1P1D system the profile runs measured."""
    return Simulation(profile, XpYd(1, 1)).run([SimRequest(r.start_s, r.prompt_len, r.output_len) for r in records])


def _num_decode_steps(records: list[RequestRecord], batch_size: int) -> int:
    """A run's decode steps: a single's tokens less one each; a wave's, its length less one plus
    the steps over which its first tokens spread (its prompts reach decode one by one)."""
    output_len = records[0].output_len
    if batch_size == 1:
        return len(records) * (output_len - 1)
    first_tokens_s = [r.start_s + r.ttft_s for r in records]
    step_s = statistics.median(tpot_s(r) for r in records)
    return output_len - 1 + round((max(first_tokens_s) - min(first_tokens_s)) / step_s)
