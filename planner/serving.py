"""What the serving path adds to the engine's steps, measured through `pdserve up`.

Three kinds of profile runs on a 1P1D system:
1. One request at a time at a few prompt and output lengths, `single_gap_s` apart (nearly
   regular arrivals, concurrency 1), so each finds the system idle, its predecessor's clean-up
   (KV release, Redis writes) done, as a request of a light load does.
2. Waves of requests sent at once, of a few shapes (`wave_shapes`: batch, prompt and output
   lengths). The gateway takes a wave's requests one at a time and the prefill steps of short
   prompts overlap it, so the slope of a wave's sorted TTFTs against their rank is paced by the
   gateway where its prompts are short: the least of the shapes' (median) slopes is the one read
   (a slope, not the last TTFT, so that one stall of a shared machine does not set it).
3. Staggered runs of a few shapes (`staggered_shapes`: requests in flight, prompt and output
   lengths), arriving regularly at the rate that keeps that many in flight at the singles'
   latency: requests joining and leaving a running batch of a few, as under a moderate load.

The overheads are what these runs took beyond what the simulation (planner/simulate.py) gives
the same traces with the engine's fits and no overheads, so that the simulation, given them
back, reproduces the runs:
- per single, TTFT beyond the simulated one; its median is the idle TTFT overhead, of which the
  gateway's share (below) comes before the prefill and the rest (`ttft_s`) after it;
- per single, E2EL - TTFT beyond the simulated decode span, regressed on its number of decode
  steps: the slope is the overhead of a step at batch 1 (`step_s`), the intercept the handoff
  (reserve, commit, join);
- the gateway's work per request (`gateway_s`): what gives the simulated waves the measured
  waves' least TTFT slope, found by `GATEWAY_ITERATIONS` proportional corrections;
- the overhead per step and running request beyond the first (`per_seq_step_s`): what gives the
  staggered runs, simulated with all of the above, their measured median TPOTs, found by
  bisection. Read where a few requests overlap, as under a load, not from the waves, whose many
  streams reaching the client at once cost more per request than a few do.
Medians throughout, since the machine may be shared.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np

from pdserve.bench.datasets import BenchRequest, make_dataset
from pdserve.bench.metrics import tpot_s
from pdserve.bench.records import RequestRecord
from pdserve.bench.runner import BenchResult, run_on
from pdserve.bench.systems import Pinning, Served, SystemOptions, all_cpus, started
from pdserve.planner.profile import Profile, ServingOverhead
from pdserve.planner.simulate import Simulation, XpYd
from pdserve.planner.summary import RequestTimes
from pdserve.planner.workload import SimRequest

REGULAR_ARRIVALS = 1000.0  # gamma shape of the gaps: all within a few % of their mean
GATEWAY_ITERATIONS = 4  # the estimate moves by well under 1 % from the third to the fourth
PER_SEQ_STEP_BOUND_S = 0.05  # far beyond any step's cost per request
BISECTIONS = 20  # to within 0.05 µs
STARTUP_TIMEOUT_S = 180.0


@dataclasses.dataclass(frozen=True, slots=True)
class ServingRunConfig:
    model_dir: Path
    log_dir: Path
    prompt_lens: tuple[int, ...] = (64, 512)
    output_lens: tuple[int, ...] = (8, 64)
    num_repeats: int = 10  # single requests per (prompt, output) point
    single_gap_s: float = 0.6  # between single requests: longer than one takes
    wave_shapes: tuple[tuple[int, int, int], ...] = ((16, 64, 64), (8, 256, 32), (4, 64, 128))  # batch, prompt, output
    num_waves: int = 2  # of each shape
    # requests in flight, prompt and output lengths; (prompt, output) among the singles'
    staggered_shapes: tuple[tuple[int, int, int], ...] = ((2, 512, 64), (2, 64, 64), (4, 64, 64))
    num_staggered: int = 32  # requests per staggered run
    num_staggered_runs: int = 3  # of each shape
    dtype: str = "float32"
    seed: int = 1000  # apart from other traces' seeds

    def __post_init__(self) -> None:
        singles = {(p, o) for p in self.prompt_lens for o in self.output_lens}
        if any((p, o) not in singles for _, p, o in self.staggered_shapes):
            raise ValueError(f"staggered shapes {self.staggered_shapes} need singles of their lengths")


def measure_serving_overhead(profile: Profile, config: ServingRunConfig) -> ServingOverhead:
    """The serving path's overheads beyond `profile`'s engine fits, from runs on a 1P1D system
    (`pdserve bench`'s disaggregated system, its replicas sharing every CPU here with the client)."""
    from pdserve.protocol.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(config.model_dir)

    def random_requests(num_prompts: int, prompt_len: int, output_len: int, seed: int) -> list[BenchRequest]:
        return make_dataset("random", num_prompts=num_prompts, seed=seed, input_len=prompt_len,
                            output_len=output_len, tokenizer=tokenizer)

    options = SystemOptions(config.model_dir, config.dtype, startup_timeout_s=STARTUP_TIMEOUT_S)
    with started("disaggregated", options, Pinning(all_cpus(), all_cpus()), config.log_dir) as system:
        # its own seed: prompts the measured runs repeat would be prefilled from the prefix cache
        bench(system, random_requests(4, 64, 8, config.seed - 1), "warm-up")
        singles = []
        for prompt_len in config.prompt_lens:
            for output_len in config.output_lens:
                requests = random_requests(config.num_repeats, prompt_len, output_len, config.seed + len(singles))
                singles.append(bench(system, requests, f"single p{prompt_len} o{output_len}", max_concurrency=1,
                                     request_rate=1 / config.single_gap_s, burstiness=REGULAR_ARRIVALS).records)
        waves = []
        for batch_size, prompt_len, output_len in config.wave_shapes:
            for _ in range(config.num_waves):
                requests = random_requests(batch_size, prompt_len, output_len, config.seed + 100 + len(waves))
                waves.append(bench(system, requests, f"wave of {batch_size} p{prompt_len} o{output_len}").records)
        single_e2el_s = {(run[0].prompt_len, run[0].output_len): statistics.median(r.e2el_s for r in run)
                         for run in singles}
        staggered = []
        for in_flight, prompt_len, output_len in config.staggered_shapes:
            for _ in range(config.num_staggered_runs):
                requests = random_requests(config.num_staggered, prompt_len, output_len,
                                           config.seed + 200 + len(staggered))
                rate = in_flight / single_e2el_s[prompt_len, output_len]  # Little's law, at idle latency
                staggered.append(bench(system, requests, f"staggered {in_flight} p{prompt_len} o{output_len}",
                                       request_rate=rate, burstiness=REGULAR_ARRIVALS).records)
    return overhead_from_records(profile, singles, waves, staggered)


def bench(system: Served, requests: list[BenchRequest], label: str, **options) -> BenchResult:
    """One run's result; raises when a request failed, which would bias every overhead read."""
    result = run_on(system, requests, label, **options)
    if result.metrics.failed:
        errors = sorted({record.error for record in result.records if record.error})
        raise RuntimeError(f"{label}: {result.metrics.failed} requests failed: {errors[:3]}")
    return result


def overhead_from_records(profile: Profile, singles: list[list[RequestRecord]], waves: list[list[RequestRecord]],
                          staggered: list[list[RequestRecord]]) -> ServingOverhead:
    """The overheads beyond what the simulation gives each run's trace under `profile`'s fits
    (its overheads are not read): `singles`, `waves` and `staggered`, one list of records per
    run, each record's `start_s` from its run's start."""
    bare = dataclasses.replace(profile, serving=ServingOverhead())
    single_records = [r for run in singles for r in run]
    simulated = [t for run in singles for t in _simulated(bare, run)]
    idle_ttft_s = statistics.median(max(0.0, r.ttft_s - t.ttft_s) for r, t in zip(single_records, simulated))
    gateway_s = _gateway_s(bare, waves, idle_ttft_s)
    num_steps = [r.output_len - 1 for r in single_records]
    beyond_s = [(r.e2el_s - r.ttft_s) - (t.finish_s - t.first_token_s) for r, t in zip(single_records, simulated)]
    step_s, intercept_s = np.polyfit(num_steps, beyond_s, 1)  # the per-step overhead at batch 1; the handoff
    at_batch_1 = ServingOverhead(gateway_s=gateway_s, ttft_s=idle_ttft_s - gateway_s,
                                 handoff_s=max(0.0, float(intercept_s)), step_s=max(0.0, float(step_s)))
    samples = [{"kind": "single", "prompt_len": r.prompt_len, "output_len": r.output_len,
                "ttft_s": r.ttft_s, "e2el_s": r.e2el_s} for r in single_records]
    samples += [{"kind": kind, "num_requests": len(records), "prompt_len": r.prompt_len, "output_len": r.output_len,
                 "start_s": r.start_s, "ttft_s": r.ttft_s, "e2el_s": r.e2el_s}
                for kind, runs in (("wave", waves), ("staggered", staggered)) for records in runs for r in records]
    return dataclasses.replace(at_batch_1, per_seq_step_s=_per_seq_step_s(
        dataclasses.replace(profile, serving=at_batch_1), staggered), samples=samples)


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
        trial = dataclasses.replace(bare, serving=ServingOverhead(gateway_s=gateway_s, ttft_s=idle_ttft_s - gateway_s))
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
