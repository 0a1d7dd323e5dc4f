"""A discrete-event model of xPyD serving: P prefill servers, D decode servers, one trace.

    arrival ─▶ gateway: `num_gateways` FIFO servers (the first free one takes the request),
               `serving.gateway_s` per request (tokenize, Redis round trips, gRPC)
            ─▶ it picks a decode (fewest held tokens), which reserves the KV blocks between
               its steps (its engine thread runs commands there): a busy decode answers when its
               step ends; then a prefill (fewest queued tokens)
            ─▶ prefill queue ─▶ steps of chunked prefill under the token budget (FIFO, partial
               chunks carried over, as engine/scheduler.py does)
            ─▶ step end: the first token, seen by the client `serving.ttft_s` later (TTFT)
            ─▶ KV handoff: lands `serving.handoff_s` + tokens × bytes/token ÷ GB/s after that
               first token (the prefill server is not held; the push runs beside its next steps)
            ─▶ decode pending ─▶ joins the running batch at the next step boundary
            ─▶ one token per running request per step; the last one ends the request

Step times come from the profile's fits plus the measured serving overheads, with their measured
spreads (planner/jitter.py): each engine step is its fit times a ratio drawn from the profile's
timed repeats of that kind of step; each request's gateway time and idle TTFT overhead are scaled
by one ratio drawn from the single requests' overheads, and its handoff gets a residual drawn
from their decode spans (floored at 0). Every engine step is then slowed by the work that shares
its replica's core (planner/cpu_sharing.py: 1 unless the profile's replicas share their cores).
That factor depends on how busy the engines are, so the run is repeated `NUM_PASSES` times, each
pass slowing the steps by what the pass before served and computed; the last pass is the answer.
Invariant: the simulation is a pure function of (profile, config, requests, seed): no clock,
draws from one generator seeded per pass in event order; events at the same instant run in the
order they were scheduled. A profile without spreads or CPU sharing gives the median model, for
any seed.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from planner.cpu_sharing import Activity, CoreUsage
from planner.jitter import Draws
from planner.profile import Profile
from planner.workload import SimRequest, Slo

PERCENTILES = (50, 90, 99)
NUM_PASSES = 4  # the slow-down factors move by well under 1 % from the third pass to the fourth


@dataclass(frozen=True, slots=True)
class XpYd:
    num_prefill: int
    num_decode: int

    def __post_init__(self) -> None:
        if self.num_prefill < 1 or self.num_decode < 1:
            raise ValueError(f"need at least one prefill and one decode server, got {self}")

    @property
    def num_gpus(self) -> int:
        return self.num_prefill + self.num_decode

    def __str__(self) -> str:
        return f"{self.num_prefill}P{self.num_decode}D"


@dataclass(frozen=True, slots=True)
class RequestTimes:
    arrival_s: float
    first_token_s: float  # at the client
    finish_s: float  # the last token at the client
    output_len: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """As bench.metrics: (E2EL - TTFT) / (output tokens - 1), 0 for one token."""
        return 0.0 if self.output_len <= 1 else (self.finish_s - self.first_token_s) / (self.output_len - 1)


@dataclass(frozen=True, slots=True)
class SimSummary:
    ttft_ms: dict[int, float]  # percentile -> ms
    tpot_ms: dict[int, float]
    goodput_rps: float  # requests/s within both SLOs, over the run's duration
    slo_attainment: float  # fraction of requests within both SLOs
    throughput_rps: float
    duration_s: float
    front_cpu_s_per_s: float = 0.0  # the front's CPU at what the run served (planner/cpu_sharing.py)

    @staticmethod
    def of(times: list[RequestTimes], slo: Slo, front_cpu_s_per_s: float = 0.0) -> SimSummary:
        ttfts_ms = np.array([t.ttft_s for t in times]) * 1000
        tpots_ms = np.array([t.tpot_s for t in times]) * 1000
        good = int(np.sum((ttfts_ms <= slo.ttft_ms) & (tpots_ms <= slo.tpot_ms)))
        duration_s = max(t.finish_s for t in times) - min(t.arrival_s for t in times)
        duration_s = duration_s if duration_s > 0 else float("inf")
        return SimSummary(
            ttft_ms={p: float(np.percentile(ttfts_ms, p)) for p in PERCENTILES},
            tpot_ms={p: float(np.percentile(tpots_ms, p)) for p in PERCENTILES},
            goodput_rps=good / duration_s, slo_attainment=good / len(times),
            throughput_rps=len(times) / duration_s, duration_s=duration_s, front_cpu_s_per_s=front_cpu_s_per_s)

    @staticmethod
    def unserved() -> SimSummary:
        """A configuration that cannot serve the trace at all (its CPUs are oversubscribed)."""
        return SimSummary(ttft_ms={p: float("inf") for p in PERCENTILES}, tpot_ms={p: float("inf") for p in PERCENTILES},
                          goodput_rps=0.0, slo_attainment=0.0, throughput_rps=0.0, duration_s=float("inf"))

    def to_dict(self) -> dict:
        return {**{f"p{p}_ttft_ms": v for p, v in self.ttft_ms.items()},
                **{f"p{p}_tpot_ms": v for p, v in self.tpot_ms.items()},
                "goodput_rps": self.goodput_rps, "slo_attainment": self.slo_attainment,
                "throughput_rps": self.throughput_rps, "duration_s": self.duration_s,
                "front_cpu_s_per_s": self.front_cpu_s_per_s}


@dataclass(slots=True)
class _Job:
    index: int
    request: SimRequest
    decode: int  # the decode server reserved at arrival
    num_computed: int = 0  # prompt tokens prefilled
    num_generated: int = 0  # output tokens, the prefill's first one included
    first_token_s: float = 0.0
    overhead_ratio: float = 1.0  # its gateway time and idle TTFT overhead over their medians


@dataclass(slots=True)
class _Server:
    kind: str  # "prefill" or "decode"
    step_stretch: float = 1.0  # its engine steps' slow-down by the work sharing its core
    queue: deque[_Job] = field(default_factory=deque)  # prefill: waiting prompts; decode: landed, not joined
    running: list[_Job] = field(default_factory=list)  # decode only
    busy: bool = False
    step_end_s: float = 0.0  # when its current step ends, while busy
    load_tokens: int = 0  # prefill: tokens left to compute; decode: prompt and output tokens held
    work_s: float = 0.0  # its engine steps, unslowed
    num_requests: int = 0  # prefill: prompts finished; decode: requests joined
    num_output_tokens: int = 0  # decode: of the requests joined, the first token included
    num_steps: int = 0

    def usage(self, duration_s: float) -> CoreUsage:
        per_s = 1 / duration_s
        return CoreUsage(self.kind, self.work_s * per_s, Activity(
            self.num_requests * per_s, self.num_output_tokens * per_s,
            self.num_steps * per_s if self.kind == "decode" else 0.0))


class Simulation:
    def __init__(self, profile: Profile, config: XpYd, num_gateways: int = 1, seed: int = 0):
        if num_gateways < 1:
            raise ValueError(f"need at least one gateway, got {num_gateways}")
        self.profile = profile
        self.config = config
        self.num_gateways = num_gateways
        self.seed = seed
        self._prefill_ratios = profile.prefill_step_ratios
        self._decode_ratios = profile.decode_step_ratios

    def run(self, requests: list[SimRequest]) -> list[RequestTimes]:
        """Times of every request, in the order given; `cores` then holds what each replica's
        core did in the last pass (prefills first), `step_stretches` what slowed its steps."""
        self.step_stretches = [1.0] * self.config.num_gpus
        for pass_index in range(NUM_PASSES):
            if pass_index:
                self.step_stretches = self.profile.serving.cpu.step_stretches(self.cores)
            times = self._run_once(requests, self.step_stretches)
            duration_s = max(t.finish_s for t in times) - min(t.arrival_s for t in times)
            self.cores = [server.usage(duration_s if duration_s > 0 else 1.0)
                          for server in self._prefills + self._decodes]
        return times

    def _run_once(self, requests: list[SimRequest], stretches: list[float]) -> list[RequestTimes]:
        self._events: list = []
        self._sequence = itertools.count()
        self._draws = Draws(self.seed)
        kinds = ["prefill"] * self.config.num_prefill + ["decode"] * self.config.num_decode
        servers = [_Server(kind, stretch) for kind, stretch in zip(kinds, stretches)]
        self._prefills, self._decodes = servers[:self.config.num_prefill], servers[self.config.num_prefill:]
        self._done: dict[int, RequestTimes] = {}
        self._gateways_free_s = [0.0] * self.num_gateways  # a heap: when each gateway is next free
        for index, request in enumerate(requests):
            self._at(request.arrival_s, self._arrive, _Job(index, request, decode=-1))
        while self._events:
            now_s, _, action, argument = heapq.heappop(self._events)
            action(now_s, argument)
        return [self._done[index] for index in range(len(requests))]

    def _at(self, time_s: float, action, argument) -> None:
        heapq.heappush(self._events, (time_s, next(self._sequence), action, argument))

    def _arrive(self, now_s: float, job: _Job) -> None:
        job.overhead_ratio = self._draws.ratio(self.profile.serving.ttft_ratios)
        gateway_s = self.profile.serving.gateway_s * job.overhead_ratio
        routed_s = max(now_s, heapq.heappop(self._gateways_free_s)) + gateway_s
        heapq.heappush(self._gateways_free_s, routed_s)
        self._at(routed_s, self._route, job)

    def _route(self, now_s: float, job: _Job) -> None:
        job.decode = min(range(len(self._decodes)), key=lambda i: (self._decodes[i].load_tokens, i))
        decode = self._decodes[job.decode]
        decode.load_tokens += job.request.prompt_len + job.request.output_len
        self._at(decode.step_end_s if decode.busy else now_s, self._reserved, job)

    def _reserved(self, now_s: float, job: _Job) -> None:
        server = min(self._prefills, key=lambda server: server.load_tokens)
        server.queue.append(job)
        server.load_tokens += job.request.prompt_len
        if not server.busy:
            self._start_prefill(now_s, server)

    def _start_prefill(self, now_s: float, server: _Server) -> None:
        budget = self.profile.max_num_batched_tokens
        chunks: list[tuple[_Job, int]] = []
        for job in server.queue:
            if budget == 0 or len(chunks) == self.profile.max_num_seqs:
                break
            num_new = min(job.request.prompt_len - job.num_computed, budget)
            chunks.append((job, num_new))
            budget -= num_new
        work_s = self.profile.prefill.step_s([(job.num_computed, n) for job, n in chunks])
        self._start_step(now_s, server, work_s * self._draws.ratio(self._prefill_ratios), self._end_prefill,
                         (server, chunks))

    def _start_step(self, now_s: float, server: _Server, work_s: float, end, argument) -> None:
        """Its engine thread's `work_s`, slowed by what shares its core."""
        server.busy = True
        server.work_s += work_s
        server.num_steps += 1
        server.step_end_s = now_s + work_s * server.step_stretch
        self._at(server.step_end_s, end, argument)

    def _end_prefill(self, now_s: float, step: tuple[_Server, list[tuple[_Job, int]]]) -> None:
        server, chunks = step
        serving = self.profile.serving
        for job, num_new in chunks:
            job.num_computed += num_new
            server.load_tokens -= num_new
            if job.num_computed < job.request.prompt_len:
                continue
            server.queue.remove(job)
            server.num_requests += 1
            job.num_generated = 1
            job.first_token_s = now_s + serving.ttft_s * job.overhead_ratio
            if job.request.output_len == 1:
                self._decodes[job.decode].load_tokens -= job.request.prompt_len + 1
                self._finish(job, job.first_token_s)
            else:
                handoff_s = max(0.0, serving.handoff_s + self._draws.residual_s(serving.handoff_residuals_s))
                landed_s = job.first_token_s + handoff_s + self.profile.transfer_s(job.request.prompt_len)
                self._at(landed_s, self._land, job)
        server.busy = False
        if server.queue:
            self._start_prefill(now_s, server)

    def _land(self, now_s: float, job: _Job) -> None:
        server = self._decodes[job.decode]
        server.queue.append(job)
        if not server.busy:
            self._start_decode(now_s, server)

    def _start_decode(self, now_s: float, server: _Server) -> None:
        num_joins = 0
        while server.queue and len(server.running) < self.profile.max_num_seqs:
            num_joins += 1
            job = server.queue.popleft()
            server.running.append(job)
            server.num_requests += 1
            server.num_output_tokens += job.request.output_len
        num_seqs = len(server.running)
        num_context_tokens = sum(job.request.prompt_len + job.num_generated for job in server.running)
        serving = self.profile.serving
        # the serving path's per-step overheads run on the engine thread too (planner/serving.py)
        work_s = (self.profile.decode.step_s(num_seqs, num_context_tokens, num_joins)
                  * self._draws.ratio(self._decode_ratios)
                  + serving.step_s + serving.per_seq_step_s * num_seqs)
        self._start_step(now_s, server, work_s, self._end_decode, server)

    def _end_decode(self, now_s: float, server: _Server) -> None:
        still_running = []
        for job in server.running:
            job.num_generated += 1
            if job.num_generated == job.request.output_len:
                server.load_tokens -= job.request.prompt_len + job.request.output_len
                self._finish(job, now_s)
            else:
                still_running.append(job)
        server.running = still_running
        server.busy = False
        if server.running or server.queue:
            self._start_decode(now_s, server)

    def _finish(self, job: _Job, finish_s: float) -> None:
        self._done[job.index] = RequestTimes(job.request.arrival_s, job.first_token_s, finish_s,
                                             job.request.output_len)


def simulate(profile: Profile, config: XpYd, requests: list[SimRequest], slo: Slo,
             num_gateways: int = 1, seed: int = 0) -> SimSummary:
    simulation = Simulation(profile, config, num_gateways, seed)
    times = simulation.run(requests)
    return SimSummary.of(times, slo, profile.serving.cpu.front_cpu_s_per_s(simulation.cores))
