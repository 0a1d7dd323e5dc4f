"""The engine as a replica runs it, and what the serving path adds, measured through `pdserve up`.

Two kinds of profile runs on a 1P1D system, neither of them a validation workload:
1. One request at a time at a few prompt and output lengths, `single_gap_s` apart (nearly
   regular arrivals, concurrency 1), so each finds the system idle, its predecessor's clean-up
   (KV release, Redis writes) done, as a request of a light load does. Per request,
   TTFT less the engine's prefill step is the idle TTFT overhead (the gateway's share of it
   below, the rest after it). E2EL - TTFT less the engine's decode steps at batch 1 is regressed
   on the number of decode steps, each request's KV copy taken off first: the slope is the
   overhead of a step at batch 1, the intercept the handoff (reserve, commit, join).
2. Waves of `batch_size` requests sent at once. The gateway takes them one at a time, and the
   prefill steps of the short prompts overlap it: the slope of the wave's sorted TTFTs against
   their rank is the gateway's time per request (an upper bound, were prefill the slower of the
   two; a slope, not the last TTFT, so that one stall of a shared machine does not set it).
   Decode runs the wave as one batch: how much more TPOT exceeds the engine step and the
   handoff's share by than at batch 1, over the batch less one, is the overhead per running
   request per step (a streamed token); the rest of the batch-1 overhead is per step.
Medians throughout, since the machine is shared; the spreads are kept as samples: each single's
idle TTFT overhead over their median (`ttft_ratios`), each single's decode span less the
regression line (`handoff_residuals_s`).

The CPU beside the engines (planner/cpu_sharing.py) is read around each of those runs
(planner/proc_cpu.py): the front's, and each replica's beyond its engine thread; first over
`idle_window_s` with no requests (the idle CPU seconds per second), then per run. What each run
took beyond the idle rate is regressed (non-negative least squares of the absolute error) on its
requests, output tokens and decode steps (the front's and the decode replica's), or on its
requests alone (the prefill replica's, which streams no tokens). A single request's decode
steps are its output tokens less one; a wave's are its length less one plus the steps over
which its prompts join (`_num_decode_steps`); the waves are what tell a token's cost from a step's.

The engine's own fits (planner/measure.py) time it alone in this process; inside a replica its
thread costs otherwise (the prefill's KV copy runs there, layer by layer; the decode's gRPC and
asyncio threads share its core and its caches). So the replicas' engine-thread CPU over the same
runs resets them: the prefill fit is scaled by that CPU over what the fit gives for the runs'
prompts, and the decode fit's intercept and per-request terms are refitted to that CPU over the
runs' decode steps (its context term kept), with a term per request joining (the reservation,
commit and join its engine thread runs), before the overheads are taken beyond them.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import numpy as np

from bench.metrics import tpot_s
from bench.records import RequestRecord
from planner.bench_runs import bench, launched, random_requests
from planner.cpu_sharing import CpuDemand, CpuSharing, shared_core_stretches
from planner.proc_cpu import cpu_during
from planner.profile import DecodeFit, PrefillFit, Profile, ServingOverhead, fit_linear

REGULAR_ARRIVALS = 1000.0  # gamma shape of the gaps: all within a few % of their mean


@dataclasses.dataclass(frozen=True, slots=True)
class ServingRunConfig:
    model_dir: Path
    log_dir: Path
    prompt_lens: tuple[int, ...] = (64, 512)
    output_lens: tuple[int, ...] = (8, 64)
    num_repeats: int = 10  # requests per (prompt, output) point: 40 samples of the idle spread
    single_gap_s: float = 0.6  # longer than a single request takes
    batch_size: int = 16
    batch_prompt_len: int = 64
    batch_output_len: int = 64
    num_waves: int = 3
    idle_window_s: float = 3.0
    dtype: str = "float32"
    seed: int = 1000  # apart from the validation traces' seeds


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

        singles, single_stretches = [], []
        for prompt_len in config.prompt_lens:
            for output_len in config.output_lens:
                requests = random_requests(config.model_dir, config.num_repeats, prompt_len, output_len,
                                           config.seed + len(singles))
                singles += run(requests, f"single p{prompt_len} o{output_len}", 1, max_concurrency=1,
                               request_rate=1 / config.single_gap_s, burstiness=REGULAR_ARRIVALS)
                single_stretches += [stretches_of(readings[-1])] * len(requests)
        waves = []
        for wave in range(config.num_waves):
            requests = random_requests(config.model_dir, config.batch_size, config.batch_prompt_len,
                                       config.batch_output_len, config.seed + 100 + wave)
            waves.append(run(requests, f"wave {wave} of {config.batch_size}", config.batch_size))
    wave_stretches = [stretches_of(reading) for reading in readings[-len(waves):]]
    served = dataclasses.replace(profile, prefill=served_prefill_fit(profile.prefill, readings),
                                 decode=served_decode_fit(profile.decode, readings))
    overhead = overhead_from_records(served, singles, waves, single_stretches, wave_stretches)
    return dataclasses.replace(served, serving=dataclasses.replace(
        overhead, cpu=sharing_from_readings(idle_cpu_s_per_s, readings),
        cpu_samples=[{"label": "idle", "cpu_s_per_s": idle_cpu_s_per_s}, *readings],
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


def overhead_from_records(profile: Profile, singles: list[RequestRecord], waves: list[list[RequestRecord]],
                          single_stretches: list[tuple[float, float]] | None = None,
                          wave_stretches: list[tuple[float, float]] | None = None) -> ServingOverhead:
    """The overheads beyond the engine's steps as the simulation slows them: by the (prefill,
    decode) factors of each single's and each wave's run (`stretches_of`; 1 if not given). The
    per-step overheads are work of the decode's engine thread, slowed with its steps."""
    single_stretches = single_stretches or [(1.0, 1.0)] * len(singles)
    wave_stretches = wave_stretches or [(1.0, 1.0)] * len(waves)
    idle_overheads_s = [max(0.0, r.ttft_s - profile.prefill.step_s([(0, r.prompt_len)]) * prefill_stretch)
                        for r, (prefill_stretch, _) in zip(singles, single_stretches)]
    idle_ttft_s = statistics.median(idle_overheads_s)
    gateway_s = max(0.0, statistics.median(
        float(np.polyfit(range(len(records)), sorted(r.ttft_s for r in records), 1)[0]) for records in waves))
    ttft_s = max(0.0, idle_ttft_s - gateway_s)
    decode_stretches = [decode_stretch for _, decode_stretch in single_stretches]
    slowed_steps = [(r.output_len - 1) * stretch for r, stretch in zip(singles, decode_stretches)]
    beyond_engine_s = [r.e2el_s - r.ttft_s - _engine_decode_s(profile, r.prompt_len, r.output_len, 1) * stretch
                       - profile.transfer_s(r.prompt_len) for r, stretch in zip(singles, decode_stretches)]
    # both per-step overheads at batch 1, as work; the handoff
    single_step_s, intercept_s = np.polyfit(slowed_steps, beyond_engine_s, 1)
    handoff_residuals_s = [float(b - (single_step_s * n + intercept_s)) for n, b in zip(slowed_steps, beyond_engine_s)]
    handoff_s = max(0.0, float(intercept_s))

    per_seq_samples_s = []
    for records, (_, stretch) in zip(waves, wave_stretches):
        batch_size = len(records)
        engine_s = statistics.median(
            _engine_decode_s(profile, r.prompt_len, r.output_len, batch_size) / (r.output_len - 1) for r in records)
        handoff_share_s = statistics.median(
            (handoff_s + profile.transfer_s(r.prompt_len)) / (r.output_len - 1) for r in records)
        beyond_s = (statistics.median(tpot_s(r) for r in records) - handoff_share_s) / stretch - engine_s
        per_seq_samples_s.append((beyond_s - single_step_s) / (batch_size - 1))
    per_seq_step_s = max(0.0, float(statistics.median(per_seq_samples_s)))
    step_s = max(0.0, float(single_step_s) - per_seq_step_s)
    samples = [{"kind": "single", "prompt_len": r.prompt_len, "output_len": r.output_len,
                "ttft_s": r.ttft_s, "e2el_s": r.e2el_s} for r in singles]
    samples += [{"kind": "wave", "batch_size": len(records), "prompt_len": r.prompt_len,
                 "output_len": r.output_len, "ttft_s": r.ttft_s, "e2el_s": r.e2el_s}
                for records in waves for r in records]
    return ServingOverhead(gateway_s=gateway_s, ttft_s=ttft_s, handoff_s=handoff_s, step_s=step_s,
                           per_seq_step_s=per_seq_step_s,
                           ttft_ratios=[o / idle_ttft_s for o in idle_overheads_s] if idle_ttft_s > 0 else [],
                           handoff_residuals_s=handoff_residuals_s, samples=samples)


def _num_decode_steps(records: list[RequestRecord], batch_size: int) -> int:
    """A run's decode steps: a single's tokens less one each; a wave's, its length less one plus
    the steps over which its first tokens spread (its prompts reach decode one by one)."""
    output_len = records[0].output_len
    if batch_size == 1:
        return len(records) * (output_len - 1)
    first_tokens_s = [r.start_s + r.ttft_s for r in records]
    step_s = statistics.median(tpot_s(r) for r in records)
    return output_len - 1 + round((max(first_tokens_s) - min(first_tokens_s)) / step_s)


def stretches_of(reading: dict) -> tuple[float, float]:
    """The (prefill, decode) factors of a 1P1D run from its CPU reading: each engine thread's
    CPU and the rest of its replica's, per second of the run, and the front's."""
    cpu_s, wall_s = reading["cpu_s"], reading["wall_s"]
    prefill_stretch, decode_stretch = shared_core_stretches(
        [cpu_s["prefill_engine"] / wall_s, cpu_s["decode_engine"] / wall_s],
        [cpu_s["prefill"] / wall_s, cpu_s["decode"] / wall_s], cpu_s["front"] / wall_s)
    return prefill_stretch, decode_stretch


def _engine_decode_s(profile: Profile, prompt_len: int, output_len: int, batch_size: int) -> float:
    """The engine's decode steps of one request in a batch of `batch_size` like it, all joined in
    the first."""
    return sum(profile.decode.step_s(batch_size, batch_size * (prompt_len + generated),
                                     num_joins=batch_size if generated == 1 else 0)
               for generated in range(1, output_len))
