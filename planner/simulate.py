"""A discrete-event model of xPyD serving: P prefill servers, D decode servers, one trace.

    arrival ─▶ gateway: `num_gateways` FIFO servers (the first free one takes the request),
               `serving.gateway_s` of work per request (tokenize, Redis round trips, gRPC)
            ─▶ it picks a decode (fewest held tokens), which reserves the KV blocks between
               its steps (its engine thread runs commands there): a busy decode answers when its
               step ends; then a prefill (fewest queued tokens)
            ─▶ prefill queue ─▶ steps of chunked prefill under the token budget (FIFO, partial
               chunks carried over, as engine/scheduler.py does)
            ─▶ step end ─▶ `serving.ttft_s` of work ─▶ the first token at the client (TTFT)
            ─▶ KV handoff: lands `serving.handoff_s` + tokens × bytes/token ÷ GB/s after that
               first token (the prefill server is not held; the push runs beside its next steps)
            ─▶ decode pending ─▶ joins the running batch at the next step boundary
            ─▶ one token per running request per step; the last one ends the request

Step times come from the profile's fits plus the measured serving overheads, with their measured
spreads (planner/jitter.py): each engine step is its fit times a ratio drawn from the profile's
timed repeats of that kind of step; each request's first token waits a delay drawn from the
staggered runs' TTFTs beyond their simulation, and its handoff a residual drawn from the single
requests' decode spans (both floored at 0).

Where the profile's replicas share the host's CPUs (a CPU host), every piece of work above is a
job on them (planner/shared_cpus.py): engine steps pinned to their replica's core, the gateway's
and the TTFT path's work floating, and beside them, at the events they belong to, the CPU work
that is on no request's path (planner/cpu_sharing.py): each replica's own per request, the
front's per decode step and the rest of its per request. A decode replica's own per-step work
(streaming the step's tokens) shares the core with its engine thread alone, so it is taken as
part of the step. A step then takes as long as what shares the CPUs while it runs makes it;
elsewhere each takes exactly its work. Neglected: the idle demands (about 1 % of a core each).

Invariant: the simulation is a pure function of (profile, config, requests, seed): no clock,
draws from one generator seeded once, in event order; events at the same instant run in the
order they were scheduled. A profile without spreads gives the median model, for any seed.
"""
from __future__ import annotations

import heapq
import itertools
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pdserve.planner.shared_cpus import SharedCpus
from pdserve.planner.jitter import Draws
from pdserve.planner.profile import Profile
from pdserve.planner.workload import SimRequest, Slo

PERCENTILES = (50, 90, 99)


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

    @staticmethod
    def parse(text: str) -> XpYd:
        """`XpYd.parse("2P6D")`, case and spaces aside."""
        match = re.fullmatch(r"(\d+)P(\d+)D", text.strip(), flags=re.IGNORECASE)
        if not match:
            raise ValueError(f"expected xPyD such as 1P1D, got {text!r}")
        return XpYd(int(match[1]), int(match[2]))


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


@dataclass(slots=True)
class _Server:
    kind: str  # "prefill" or "decode"
    core: int  # the CPU its replica is pinned to, where the replicas share the host's CPUs
    queue: deque[_Job] = field(default_factory=deque)  # prefill: waiting prompts; decode: landed, not joined
    running: list[_Job] = field(default_factory=list)  # decode only
    reserving: list[_Job] = field(default_factory=list)  # decode only: reservations waiting for its step to end
    busy: bool = False
    load_tokens: int = 0  # prefill: tokens left to compute; decode: prompt and output tokens held


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
        """Times of every request, in the order given. Then `engine_work_s` holds the engines'
        work over the run by kind ("prefill", "decode"), and `front_cpu_s` the front's (0 where
        the replicas do not share the host's CPUs)."""
        self._events: list = []
        self._sequence = itertools.count()
        self._draws = Draws(self.seed)
        cpu = self.profile.serving.cpu
        self._cores = SharedCpus(self.config.num_gpus, self._at) if cpu.shares_replica_cpus else None
        kinds = ["prefill"] * self.config.num_prefill + ["decode"] * self.config.num_decode
        servers = [_Server(kind, core) for core, kind in enumerate(kinds)]
        self._prefills, self._decodes = servers[:self.config.num_prefill], servers[self.config.num_prefill:]
        self._done: dict[int, RequestTimes] = {}
        self._gateway_queue: deque[_Job] = deque()
        self._num_free_gateways = self.num_gateways
        self.engine_work_s = {"prefill": 0.0, "decode": 0.0}
        self.front_cpu_s = 0.0
        for index, request in enumerate(requests):
            self._at(request.arrival_s, self._arrive, _Job(index, request, decode=-1))
        while self._events:
            now_s, _, action, argument = heapq.heappop(self._events)
            action(now_s, argument)
        return [self._done[index] for index in range(len(requests))]

    def _at(self, time_s: float, action, argument) -> None:
        heapq.heappush(self._events, (time_s, next(self._sequence), action, argument))

    def _compute(self, now_s: float, work_s: float, then: Callable[[float], None], core: int | None = None) -> None:
        """`work_s` of CPU on the path of a request: on `core` (None: the front's, floating) of the
        shared CPUs, or taking exactly `work_s` where the replicas have theirs to themselves."""
        if self._cores is None:
            self._at(now_s + work_s, _call, then)
        else:
            self._cores.start(now_s, work_s, then, core)

    def _engine_step(self, now_s: float, server: _Server, work_s: float, then: Callable[[float], None]) -> None:
        server.busy = True
        self.engine_work_s[server.kind] += work_s
        self._compute(now_s, work_s, then, server.core)

    def _beside(self, now_s: float, work_s: float, core: int | None = None) -> None:
        """`work_s` of CPU on no request's path, which only slows what shares its core."""
        if self._cores is not None and work_s > 0:
            self._cores.start(now_s, work_s, _ignore, core)

    def _front(self, now_s: float, work_s: float, then: Callable[[float], None] | None = None) -> None:
        """The front's work, floating: on a request's path when `then` follows it, else beside."""
        if self._cores is not None:
            self.front_cpu_s += work_s
        if then is None:
            self._beside(now_s, work_s)
        else:
            self._compute(now_s, work_s, then)

    def _arrive(self, now_s: float, job: _Job) -> None:
        self._gateway_queue.append(job)
        if self._num_free_gateways:
            self._next_at_gateway(now_s)

    def _next_at_gateway(self, now_s: float) -> None:
        """A gateway takes the first request waiting and routes it after its `gateway_s`."""
        self._num_free_gateways -= 1
        job = self._gateway_queue.popleft()
        self._front(now_s, self.profile.serving.gateway_s, lambda t: self._route(t, job))

    def _route(self, now_s: float, job: _Job) -> None:
        self._num_free_gateways += 1
        if self._gateway_queue:
            self._next_at_gateway(now_s)
        job.decode = min(range(len(self._decodes)), key=lambda i: (self._decodes[i].load_tokens, i))
        decode = self._decodes[job.decode]
        decode.load_tokens += job.request.prompt_len + job.request.output_len
        if decode.busy:  # its engine thread answers between steps
            decode.reserving.append(job)
        else:
            self._reserved(now_s, job)

    def _reserved(self, now_s: float, job: _Job) -> None:
        decode = self._decodes[job.decode]
        self._beside(now_s, self.profile.serving.cpu.decode.per_request_s, decode.core)
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
        self._engine_step(now_s, server, work_s * self._draws.ratio(self._prefill_ratios),
                          lambda t: self._end_prefill(t, server, chunks))

    def _end_prefill(self, now_s: float, server: _Server, chunks: list[tuple[_Job, int]]) -> None:
        for job, num_new in chunks:
            job.num_computed += num_new
            server.load_tokens -= num_new
            if job.num_computed < job.request.prompt_len:
                continue
            server.queue.remove(job)
            self._beside(now_s, self.profile.serving.cpu.prefill.per_request_s, server.core)
            job.num_generated = 1
            delay_s = max(0.0, self._draws.residual_s(self.profile.serving.ttft_delays_s))
            self._front(now_s, self.profile.serving.ttft_s,
                        lambda t, job=job, delay_s=delay_s: self._at(t + delay_s, self._first_token, job))
        server.busy = False
        if server.queue:
            self._start_prefill(now_s, server)

    def _first_token(self, now_s: float, job: _Job) -> None:
        """The first token at the client; its KV is pushed meanwhile, landing after the handoff."""
        serving = self.profile.serving
        job.first_token_s = now_s
        if job.request.output_len == 1:
            self._decodes[job.decode].load_tokens -= job.request.prompt_len + 1
            self._finish(job, now_s)
            return
        handoff_s = max(0.0, serving.handoff_s + self._draws.residual_s(serving.handoff_residuals_s))
        self._at(now_s + handoff_s + self.profile.transfer_s(job.request.prompt_len), self._land, job)

    def _land(self, now_s: float, job: _Job) -> None:
        server = self._decodes[job.decode]
        server.queue.append(job)
        if not server.busy:
            self._start_decode(now_s, server)

    def _start_decode(self, now_s: float, server: _Server) -> None:
        num_joins = 0
        while server.queue and len(server.running) < self.profile.max_num_seqs:
            num_joins += 1
            server.running.append(server.queue.popleft())
        num_seqs = len(server.running)
        num_context_tokens = sum(job.request.prompt_len + job.num_generated for job in server.running)
        serving = self.profile.serving
        # the serving path's per-step overheads run on the engine thread too (planner/serving.py)
        work_s = (self.profile.decode.step_s(num_seqs, num_context_tokens, num_joins)
                  * self._draws.ratio(self._decode_ratios)
                  + serving.step_s + serving.per_seq_step_s * (num_seqs - 1))
        if self._cores is not None:  # its replica streams the step's tokens on the same core
            work_s += serving.cpu.decode.per_decode_step_s + serving.cpu.decode.per_output_token_s * num_seqs
        self._engine_step(now_s, server, work_s, lambda t: self._end_decode(t, server))

    def _end_decode(self, now_s: float, server: _Server) -> None:
        front = self.profile.serving.cpu.front
        self._front(now_s, front.per_decode_step_s + front.per_output_token_s * len(server.running))
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
        reserving, server.reserving = server.reserving, []
        for job in reserving:
            self._reserved(now_s, job)
        if server.running or server.queue:
            self._start_decode(now_s, server)

    def _finish(self, job: _Job, finish_s: float) -> None:
        serving = self.profile.serving
        # the front's work for a request beyond what its path to the first token timed
        self._front(finish_s, max(0.0, serving.cpu.front.per_request_s - serving.gateway_s - serving.ttft_s))
        self._done[job.index] = RequestTimes(job.request.arrival_s, job.first_token_s, finish_s,
                                             job.request.output_len)


def _call(now_s: float, then: Callable[[float], None]) -> None:
    then(now_s)


def _ignore(now_s: float) -> None:
    pass


def simulate(profile: Profile, config: XpYd, requests: list[SimRequest], slo: Slo,
             num_gateways: int = 1, seed: int = 0) -> SimSummary:
    simulation = Simulation(profile, config, num_gateways, seed)
    times = simulation.run(requests)
    duration_s = max(t.finish_s for t in times) - min(t.arrival_s for t in times)
    front_cpu_s_per_s = (profile.serving.cpu.front.idle_s_per_s + simulation.front_cpu_s / duration_s
                         if profile.serving.cpu.shares_replica_cpus and duration_s > 0 else 0.0)
    return SimSummary.of(times, slo, front_cpu_s_per_s)
