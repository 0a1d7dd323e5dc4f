"""What the serving path adds to the engine's step times, measured through `pdserve up`.

Two kinds of profile runs on a 1P1D system, neither of them a validation workload:
1. One request at a time at a few prompt and output lengths, `single_gap_s` apart (nearly
   regular arrivals, concurrency 1), so each finds the system idle, its predecessor's clean-up
   (KV release, Redis writes) done, as a request of a light load does. Per request,
   TTFT less the engine's prefill step is the idle TTFT overhead (the gateway's share of it
   below, the rest after it). E2EL - TTFT less the engine's decode steps at batch 1 is regressed
   on the number of decode steps: the slope is the overhead of a step at batch 1, the intercept
   less the KV copy is the handoff (reserve, commit, join).
2. Waves of `batch_size` requests sent at once. The gateway takes them one at a time, and the
   prefill steps of the short prompts overlap it: the slope of the wave's sorted TTFTs against
   their rank is the gateway's time per request (an upper bound, were prefill the slower of the
   two; a slope, not the last TTFT, so that one stall of a shared machine does not set it).
   Decode runs the wave as one batch: how much more TPOT exceeds the engine step and the
   handoff's share by than at batch 1, over the batch less one, is the overhead per running
   request per step (a streamed token); the rest of the batch-1 overhead is per step.
Medians throughout, since the machine is shared.
"""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np

from bench.metrics import tpot_s
from bench.records import RequestRecord
from planner.bench_runs import bench, launched, random_requests
from planner.profile import Profile, ServingOverhead

REGULAR_ARRIVALS = 1000.0  # gamma shape of the gaps: all within a few % of their mean


@dataclasses.dataclass(frozen=True, slots=True)
class ServingRunConfig:
    model_dir: Path
    log_dir: Path
    prompt_lens: tuple[int, ...] = (64, 512)
    output_lens: tuple[int, ...] = (8, 64)
    num_repeats: int = 5  # requests per (prompt, output) point
    single_gap_s: float = 0.6  # longer than a single request takes
    batch_size: int = 16
    batch_prompt_len: int = 64
    batch_output_len: int = 64
    num_waves: int = 3
    dtype: str = "float32"
    seed: int = 1000  # apart from the validation traces' seeds


def measure_serving_overhead(profile: Profile, config: ServingRunConfig) -> ServingOverhead:
    with launched(config.model_dir, 1, config.log_dir / "serving_profile.log", dtype=config.dtype) as base_url:
        # its own seed: prompts the measured runs repeat would be prefilled from the prefix cache
        bench(base_url, random_requests(config.model_dir, 4, 64, 8, config.seed - 1), "warm-up", progress=False)
        singles = []
        for prompt_len in config.prompt_lens:
            for output_len in config.output_lens:
                requests = random_requests(config.model_dir, config.num_repeats, prompt_len, output_len,
                                           config.seed + len(singles))
                singles += bench(base_url, requests, f"single p{prompt_len} o{output_len}", max_concurrency=1,
                                 request_rate=1 / config.single_gap_s, burstiness=REGULAR_ARRIVALS).records
        waves = []
        for wave in range(config.num_waves):
            requests = random_requests(config.model_dir, config.batch_size, config.batch_prompt_len,
                                       config.batch_output_len, config.seed + 100 + wave)
            waves.append(bench(base_url, requests, f"wave {wave} of {config.batch_size}").records)
    return overhead_from_records(profile, singles, waves)


def overhead_from_records(profile: Profile, singles: list[RequestRecord],
                          waves: list[list[RequestRecord]]) -> ServingOverhead:
    idle_ttft_s = statistics.median(r.ttft_s - profile.prefill.step_s([(0, r.prompt_len)]) for r in singles)
    gateway_s = max(0.0, statistics.median(
        float(np.polyfit(range(len(records)), sorted(r.ttft_s for r in records), 1)[0]) for records in waves))
    ttft_s = max(0.0, idle_ttft_s - gateway_s)
    num_steps = [r.output_len - 1 for r in singles]
    beyond_engine_s = [r.e2el_s - r.ttft_s - _engine_decode_s(profile, r.prompt_len, r.output_len, 1)
                       for r in singles]
    single_step_s, intercept_s = np.polyfit(num_steps, beyond_engine_s, 1)  # both overheads, at batch 1
    transfer_s = statistics.median(profile.transfer_s(r.prompt_len) for r in singles)
    handoff_s = max(0.0, float(intercept_s) - transfer_s)

    per_seq_samples_s = []
    for records in waves:
        batch_size = len(records)
        engine_s = statistics.median(
            _engine_decode_s(profile, r.prompt_len, r.output_len, batch_size) / (r.output_len - 1) for r in records)
        handoff_share_s = statistics.median(
            (handoff_s + profile.transfer_s(r.prompt_len)) / (r.output_len - 1) for r in records)
        beyond_s = statistics.median(tpot_s(r) for r in records) - engine_s - handoff_share_s
        per_seq_samples_s.append((beyond_s - single_step_s) / (batch_size - 1))
    per_seq_step_s = max(0.0, float(statistics.median(per_seq_samples_s)))
    step_s = max(0.0, float(single_step_s) - per_seq_step_s)
    samples = [{"kind": "single", "prompt_len": r.prompt_len, "output_len": r.output_len,
                "ttft_s": r.ttft_s, "e2el_s": r.e2el_s} for r in singles]
    samples += [{"kind": "wave", "batch_size": len(records), "prompt_len": r.prompt_len,
                 "output_len": r.output_len, "ttft_s": r.ttft_s, "e2el_s": r.e2el_s}
                for records in waves for r in records]
    return ServingOverhead(gateway_s=gateway_s, ttft_s=ttft_s, handoff_s=handoff_s, step_s=step_s,
                           per_seq_step_s=per_seq_step_s, samples=samples)


def _engine_decode_s(profile: Profile, prompt_len: int, output_len: int, batch_size: int) -> float:
    """The engine's decode steps of one request in a batch of `batch_size` like it."""
    return sum(profile.decode.step_s(batch_size, batch_size * (prompt_len + generated))
               for generated in range(1, output_len))
