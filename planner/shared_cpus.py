"""A host's CPUs shared fairly among the jobs running on them, some pinned to a core, some not.

A job is CPU work (seconds of one core to itself) and a callback for the moment it is done. A
pinned job runs on its core only: an engine step on its replica's core (`pdserve up` pins each
replica to one), the replica's own request handling beside it. A floating job may run anywhere:
the front (gateway, Redis, client). Between events every job runs at a rate set as Linux's
fair scheduler, balancing its run queues, tends to set it: max-min fair, the floating jobs
spread over whatever the pinned ones leave.

    level L: the rate each job gets unless its core holds it below L;
    a core with n pinned jobs gives them min(L, 1/n) each and its rest, max(0, 1 - n L), to the
    floating jobs; L solves  num_floating * L = sum over cores of max(0, 1 - n L),  L <= 1.

So two engines stepping beside one front job each run at 2/3, and the front job at 2/3 spread
over both cores; an engine beside an idle core loses nothing to the front. A step shares its
core with the front's bursts exactly when they coincide, which is what lengthens the tails of a
loaded CPU host beyond an average slow-down.

Invariant: between two events that change the jobs, every job loses work at its rate; the next
completion is scheduled afresh at every change, and one scheduled before the change is ignored
when it comes (its version is stale).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

DONE_S = 1e-12  # work left below this is done (rounding of the rate updates)

Schedule = Callable[[float, Callable[[float, object], None], object], None]  # (time_s, action, argument)


@dataclass(slots=True)
class _Job:
    work_left_s: float
    on_done: Callable[[float], None]
    core: int | None  # None: floating
    rate: float = 0.0  # cores' worth of CPU it gets now


@functools.lru_cache(maxsize=1 << 16)  # a run revisits few of its states: one job changes at a time
def fair_rates(num_pinned: tuple[int, ...], num_floating: int) -> tuple[tuple[float, ...], float]:
    """(the rate of a job pinned to each core, the rate of a floating job), as the module says."""
    if num_floating == 0:
        return tuple(1 / n if n else 0.0 for n in num_pinned), 0.0
    # cores fill in order of their pinned jobs, most first: find the level where that stops
    counts = sorted(num_pinned, reverse=True)
    num_giving, pinned_giving = len(counts), sum(counts)
    level = min(1.0, num_giving / (pinned_giving + num_floating))
    while num_giving and counts[len(counts) - num_giving] * level >= 1:
        pinned_giving -= counts[len(counts) - num_giving]
        num_giving -= 1
        level = min(1.0, num_giving / (pinned_giving + num_floating))
    return tuple(min(level, 1 / n) if n else 0.0 for n in num_pinned), level


class SharedCpus:
    def __init__(self, num_cores: int, schedule: Schedule):
        if num_cores < 1:
            raise ValueError(f"need at least one core, got {num_cores}")
        self._num_cores = num_cores
        self._schedule = schedule
        self._jobs: list[_Job] = []
        self._num_pinned = [0] * num_cores  # jobs pinned to each core, of `_jobs`
        self._updated_s = 0.0
        self._version = 0

    def start(self, now_s: float, work_s: float, on_done: Callable[[float], None], core: int | None = None) -> None:
        """Run `work_s` of CPU from `now_s` on `core`, or floating if None; calls `on_done(time_s)`
        when it is done."""
        if core is not None and not 0 <= core < self._num_cores:
            raise ValueError(f"core {core} of {self._num_cores}")
        self._advance(now_s)
        self._jobs.append(_Job(work_s, on_done, core))
        if core is not None:
            self._num_pinned[core] += 1
        self._reschedule(now_s)

    def _advance(self, now_s: float) -> None:
        elapsed_s = now_s - self._updated_s
        for job in self._jobs:
            job.work_left_s -= elapsed_s * job.rate
        self._updated_s = now_s

    def _reschedule(self, now_s: float) -> None:
        self._version += 1
        if not self._jobs:
            return
        pinned_rates, floating_rate = fair_rates(tuple(self._num_pinned), len(self._jobs) - sum(self._num_pinned))
        next_s = float("inf")
        for job in self._jobs:
            job.rate = floating_rate if job.core is None else pinned_rates[job.core]
            next_s = min(next_s, now_s + max(0.0, job.work_left_s) / job.rate)
        self._schedule(next_s, self._complete, self._version)

    def _complete(self, now_s: float, version: int) -> None:
        if version != self._version:
            return
        self._advance(now_s)
        done = [job for job in self._jobs if job.work_left_s <= DONE_S]
        self._jobs = [job for job in self._jobs if job.work_left_s > DONE_S]
        for job in done:
            if job.core is not None:
                self._num_pinned[job.core] -= 1
        self._reschedule(now_s)
        for job in done:
            job.on_done(now_s)
