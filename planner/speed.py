"""The machine's speed while something runs, read by a light probe beside it.

On a shared host (a VM among changing neighbours) the same work can take twice as long from one
minute to the next, whatever runs on it. A probe process beside the runs times a fixed piece of
interpreter work (`REFERENCE_WORK`, about a millisecond) every `interval_s`, floating over the
CPUs as the front does; the median of its timings over a window is the window's reference time,
which tracks how long the engines' steps take there (the steps of a small model are interpreter
work for the most part). It costs well under 1 % of a core.

A profile records the reference time of the runs it was read from (`hardware["reference_s"]`),
each validation run its own, and `at_speed` sets a profile to another window's speed: every
duration in it scaled by the ratio of the two reference times. So a prediction can be compared
with a run at the speed the machine had during that run, beside the prediction at the profile's.
"""
from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys

from planner.cpu_sharing import CpuDemand, CpuSharing
from planner.profile import DecodeFit, PrefillFit, Profile

REFERENCE_WORK = "sum(i * i for i in range(20000))"
_PROBE = """
import sys, time
interval_s = float(sys.argv[1])
while True:
    started_s = time.perf_counter()
    {work}
    print(time.perf_counter() - started_s, flush=True)
    time.sleep(interval_s)
""".format(work=REFERENCE_WORK)
STOP_TIMEOUT_S = 10.0


class SpeedProbe:
    """`with SpeedProbe() as probe: ...`, then `probe.reference_s`: the median timing of the
    reference work while the block ran."""

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self.timings_s: list[float] = []

    def __enter__(self) -> SpeedProbe:
        self._process = subprocess.Popen([sys.executable, "-c", _PROBE, str(self.interval_s)],
                                         stdout=subprocess.PIPE, text=True)
        self.timings_s = [float(self._process.stdout.readline())]  # running: at least one timing
        return self

    def __exit__(self, *exc_info) -> None:
        self._process.terminate()
        remaining, _ = self._process.communicate(timeout=STOP_TIMEOUT_S)
        self.timings_s += [float(line) for line in remaining.split()]

    @property
    def reference_s(self) -> float:
        return statistics.median(self.timings_s)


def at_speed(profile: Profile, reference_s: float) -> Profile:
    """`profile` as the machine would have measured it at `reference_s`: every duration scaled
    by `reference_s` over the profile's own; unchanged for a profile without one."""
    own_s = profile.hardware.get("reference_s")
    if not own_s:
        return profile
    scale = reference_s / own_s
    serving = profile.serving
    return dataclasses.replace(
        profile, transfer_gb_per_s=profile.transfer_gb_per_s / scale,
        prefill=PrefillFit(*(scale * value for value in dataclasses.astuple(profile.prefill))),
        decode=DecodeFit(*(scale * value for value in dataclasses.astuple(profile.decode))),
        serving=dataclasses.replace(
            serving, gateway_s=scale * serving.gateway_s, ttft_s=scale * serving.ttft_s,
            handoff_s=scale * serving.handoff_s, step_s=scale * serving.step_s,
            per_seq_step_s=scale * serving.per_seq_step_s,
            handoff_residuals_s=[scale * residual_s for residual_s in serving.handoff_residuals_s],
            cpu=CpuSharing(serving.cpu.shares_replica_cpus, *(
                CpuDemand(*(scale * value for value in dataclasses.astuple(demand)))
                for demand in (serving.cpu.front, serving.cpu.prefill, serving.cpu.decode)))))
