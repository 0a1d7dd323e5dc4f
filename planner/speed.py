"""The machine's speed, read on a quiet machine by timing a fixed step of the engine.

On a shared host (a VM among changing neighbours) the same work can take twice as long from one
minute to the next, whatever runs on it. A probe process holds an engine of the profiled model
on one torch thread, as a replica on one CPU runs it, and on each request times one fixed step
pair, a prefill of `PROMPT_LEN` random tokens and the decode step after it, over and over for
`window_s`; the median of those timings is the window's reference time. The probe is read only
while nothing else runs (before and after a run, never during one), so that a reading is the
machine's speed, not the run's contention for its CPUs; between readings it waits on its pipe
and takes no CPU.

A profile records the median of readings taken before, between and after its parts
(`hardware["reference_s"]`; one reading caught by a neighbour's burst does not set it), each
validation run the mean of one reading before it and one after, and `at_speed` sets a profile
to another window's speed: every duration in it scaled by the ratio of the two reference times.
So a prediction can be compared with a run at the speed the machine had around that run, beside
the prediction at the profile's. The probe runs the engine on the CPU: a GPU profile has no
reference time.
"""
from __future__ import annotations

import dataclasses
import random
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.profile import DecodeFit, DecodeSample, PrefillFit, PrefillSample, Profile

PROMPT_LEN = 64
NUM_BLOCKS = 16  # room for the one request of a step pair
READY = "ready"
LOAD_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


class SpeedProbe:
    """`with SpeedProbe(model_dir) as probe: ... probe.read_s() ...`: each call, the reference
    time of a window of `window_s` read now."""

    def __init__(self, model_dir: Path, window_s: float = 2.0):
        self.model_dir = model_dir
        self.window_s = window_s

    def __enter__(self) -> SpeedProbe:
        self._process = subprocess.Popen([sys.executable, "-m", "pdserve.planner.speed", str(self.model_dir)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self._line(LOAD_TIMEOUT_S) != READY:
            self.__exit__()
            raise RuntimeError(f"speed probe: no engine of {self.model_dir} (its stderr says why)")
        return self

    def __exit__(self, *exc_info) -> None:
        self._process.stdin.close()
        try:
            self._process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def read_s(self) -> float:
        self._process.stdin.write(f"{self.window_s}\n")
        self._process.stdin.flush()
        line = self._line(self.window_s + STOP_TIMEOUT_S)
        if not line:
            raise RuntimeError("speed probe: gone before it answered")
        return float(line)

    def _line(self, timeout_s: float) -> str:
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        return self._process.stdout.readline().strip() if ready else ""


def _serve(model_dir: str) -> None:
    """The probe process: an engine, then one window of timed step pairs per line read."""
    import torch

    from pdserve.engine.engine_config import EngineConfig
    from pdserve.engine.llm_engine import LLMEngine
    from pdserve.engine.sampling_params import SamplingParams

    torch.set_num_threads(1)
    engine = LLMEngine(EngineConfig(model=model_dir, num_gpu_blocks=NUM_BLOCKS,
                                    enable_prefix_caching=False, detokenize=False))
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    rng = random.Random(0)
    request_ids = iter(range(sys.maxsize))

    def step_pair_s() -> float:
        prompt = [rng.randrange(engine.model_config.vocab_size) for _ in range(PROMPT_LEN)]
        engine.add_request(str(next(request_ids)), prompt, params)
        started_s = time.perf_counter()
        engine.step()  # the prefill
        engine.step()  # one decode step, the last
        elapsed_s = time.perf_counter() - started_s
        while engine.has_unfinished_requests():
            engine.step()
        return elapsed_s

    step_pair_s()  # untimed warm-up
    print(READY, flush=True)
    for line in sys.stdin:
        deadline_s = time.perf_counter() + float(line)
        timings_s = [step_pair_s()]
        while time.perf_counter() < deadline_s:
            timings_s.append(step_pair_s())
        print(statistics.median(timings_s), flush=True)


def at_speed(profile: Profile, reference_s: float) -> Profile:
    """`profile` as the machine would have measured it at `reference_s`: every duration scaled
    by `reference_s` over the profile's own; unchanged for a profile without one."""
    own_s = profile.hardware.get("reference_s")
    return scaled(profile, reference_s / own_s) if own_s else profile


def scaled(profile: Profile, scale: float) -> Profile:
    """`profile` on a machine `scale` times as slow: every duration in it times `scale` (the
    serving runs' requests' TTFT and E2EL too, not their send times)."""
    serving = profile.serving
    return dataclasses.replace(
        profile, transfer_gb_per_s=profile.transfer_gb_per_s / scale,
        prefill=PrefillFit(*(scale * value for value in dataclasses.astuple(profile.prefill))),
        decode=DecodeFit(*(scale * value for value in dataclasses.astuple(profile.decode))),
        serving=dataclasses.replace(
            serving, gateway_s=scale * serving.gateway_s, ttft_s=scale * serving.ttft_s,
            handoff_s=scale * serving.handoff_s, step_s=scale * serving.step_s,
            per_seq_step_s=scale * serving.per_seq_step_s,
            ttft_delays_s=[scale * delay_s for delay_s in serving.ttft_delays_s],
            handoff_residuals_s=[scale * residual_s for residual_s in serving.handoff_residuals_s],
            cpu=CpuSharing(serving.cpu.shares_replica_cpus, *(
                CpuDemand(*(scale * value for value in dataclasses.astuple(demand)))
                for demand in (serving.cpu.front, serving.cpu.prefill, serving.cpu.decode))),
            samples=[{**sample, "ttft_s": scale * sample["ttft_s"], "e2el_s": scale * sample["e2el_s"]}
                     for sample in serving.samples]),
        prefill_samples=[_scaled_sample(sample, scale) for sample in profile.prefill_samples],
        decode_samples=[_scaled_sample(sample, scale) for sample in profile.decode_samples])


def _scaled_sample(sample: PrefillSample | DecodeSample, scale: float) -> PrefillSample | DecodeSample:
    return dataclasses.replace(sample, step_s=scale * sample.step_s, timings_s=[scale * t for t in sample.timings_s])


if __name__ == "__main__":
    _serve(sys.argv[1])
