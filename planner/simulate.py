"""A discrete-event model of xPyD serving: P prefill servers, D decode servers, one trace.

    arrival ─▶ the gateway picks a decode (fewest held tokens), which reserves the KV blocks between
               its steps (its engine thread runs commands there): a busy decode answers when its
               step ends; then a prefill (fewest queued tokens)
            ─▶ prefill queue ─▶ steps of chunked prefill under the token budget (FIFO, partial
               chunks carried over, as engine/scheduler.py does)
            ─▶ step end: the first token at the client (TTFT)
            ─▶ KV handoff: lands tokens × bytes/token ÷ GB/s after that first token (the
               prefill server is not held; the push runs beside its next steps)
            ─▶ decode pending ─▶ joins the running batch at the next step boundary
            ─▶ one token per running request per step; the last one ends the request

A step takes its profile's fit, the engine's time alone (no gateway, RPCs or streaming). The trace
comes from `bench.datasets` (a `Workload`), so it is the one `pdserve bench serve` sends with the
same flags; each request ends as a `bench.records.RequestRecord`, summed up by `bench.metrics`.
Invariant: the simulation is a pure function of (profile, config, requests): no clock, no
randomness; events at the same instant run in the order they were scheduled.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import re
from collections import deque
from dataclasses import dataclass, field

from pdserve.bench.datasets import arrival_offsets_s, make_dataset
from pdserve.bench.goodput_search import attainment
from pdserve.bench.metrics import compute_metrics
from pdserve.bench.records import RequestRecord
from pdserve.planner.profile import Profile


@dataclass(frozen=True, slots=True)
class SimRequest:
    arrival_s: float
    prompt_len: int
    output_len: int


@dataclass(frozen=True, slots=True)
class Workload:
    request_rate: float  # requests/s; inf sends every request at once
    num_requests: int
    input_len: int
    output_len: int
    range_ratio: float = 0.0
    dataset: str = "random"  # one of bench.datasets.DATASET_KINDS
    seed: int = 0

    def requests(self) -> list[SimRequest]:
        dataset = make_dataset(self.dataset, num_prompts=self.num_requests, seed=self.seed, input_len=self.input_len,
                               output_len=self.output_len, range_ratio=self.range_ratio, vocab_size=2)
        offsets_s = arrival_offsets_s(self.num_requests, self.request_rate, self.seed)
        return [SimRequest(offset_s, len(request.prompt_token_ids), request.output_len)
                for offset_s, request in zip(offsets_s, dataset)]

    def to_dict(self) -> dict:
        rate = "inf" if math.isinf(self.request_rate) else self.request_rate
        return {**dataclasses.asdict(self), "request_rate": rate}


@dataclass(frozen=True, slots=True)
class XpYd:
    num_prefill: int
    num_decode: int

    def __post_init__(self) -> None:
        if self.num_prefill < 1 or self.num_decode < 1:
            raise ValueError(f"need at least one prefill and one decode server, got {self}")

    def __str__(self) -> str:
        return f"{self.num_prefill}P{self.num_decode}D"

    @staticmethod
    def parse(text: str) -> XpYd:  # "2P6D", case and spaces aside
        match = re.fullmatch(r"(\d+)P(\d+)D", text.strip(), flags=re.IGNORECASE)
        if not match:
            raise ValueError(f"expected xPyD such as 1P1D, got {text!r}")
        return XpYd(int(match[1]), int(match[2]))


@dataclass(slots=True)
class _Job:
    index: int
    request: SimRequest
    decode: int = -1  # the decode server reserved at routing
    num_computed: int = 0  # prompt tokens prefilled
    num_generated: int = 0  # output tokens, the prefill's first one included
    first_token_s: float = 0.0


@dataclass(slots=True)
class _Server:
    queue: deque[_Job] = field(default_factory=deque)  # prefill: waiting prompts; decode: landed, not joined
    running: list[_Job] = field(default_factory=list)  # decode only
    reserving: list[_Job] = field(default_factory=list)  # decode only: reservations waiting for its step to end
    busy: bool = False
    load_tokens: int = 0  # prefill: tokens left to compute; decode: prompt and output tokens held


class Simulation:
    def __init__(self, profile: Profile, config: XpYd):
        self.profile, self.config = profile, config

    def run(self, requests: list[SimRequest]) -> list[RequestRecord]:
        """Every request's record, in the order given; `start_s` is its arrival."""
        self._events: list = []
        self._sequence = itertools.count()
        self._prefills = [_Server() for _ in range(self.config.num_prefill)]
        self._decodes = [_Server() for _ in range(self.config.num_decode)]
        self._done: dict[int, RequestRecord] = {}
        for index, request in enumerate(requests):
            self._at(request.arrival_s, self._route, _Job(index, request))
        while self._events:
            now_s, _, action, arguments = heapq.heappop(self._events)
            action(now_s, *arguments)
        return [self._done[index] for index in range(len(requests))]

    def _at(self, time_s: float, action, *arguments) -> None:
        heapq.heappush(self._events, (time_s, next(self._sequence), action, arguments))

    def _route(self, now_s: float, job: _Job) -> None:
        job.decode = min(range(len(self._decodes)), key=lambda i: (self._decodes[i].load_tokens, i))
        decode = self._decodes[job.decode]
        decode.load_tokens += job.request.prompt_len + job.request.output_len
        if decode.busy:  # its engine thread answers between steps
            decode.reserving.append(job)
        else:
            self._reserved(now_s, job)

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
        server.busy = True
        step_s = self.profile.prefill.step_s([(job.num_computed, n) for job, n in chunks])
        self._at(now_s + step_s, self._end_prefill, server, chunks)

    def _end_prefill(self, now_s: float, server: _Server, chunks: list[tuple[_Job, int]]) -> None:
        for job, num_new in chunks:
            job.num_computed += num_new
            server.load_tokens -= num_new
            if job.num_computed < job.request.prompt_len:
                continue
            server.queue.remove(job)
            job.num_generated = 1
            self._first_token(now_s, job)
        server.busy = False
        if server.queue:
            self._start_prefill(now_s, server)

    def _first_token(self, now_s: float, job: _Job) -> None:
        """The first token at the client; its KV is pushed meanwhile, landing after the handoff."""
        job.first_token_s = now_s
        if job.request.output_len == 1:
            self._decodes[job.decode].load_tokens -= job.request.prompt_len + 1
            self._finish(now_s, job)
            return
        self._at(now_s + self.profile.transfer_s(job.request.prompt_len), self._land, job)

    def _land(self, now_s: float, job: _Job) -> None:
        server = self._decodes[job.decode]
        server.queue.append(job)
        if not server.busy:
            self._start_decode(now_s, server)

    def _start_decode(self, now_s: float, server: _Server) -> None:
        while server.queue and len(server.running) < self.profile.max_num_seqs:
            server.running.append(server.queue.popleft())
        num_context_tokens = sum(job.request.prompt_len + job.num_generated for job in server.running)
        step_s = self.profile.decode.step_s(len(server.running), num_context_tokens)
        server.busy = True
        self._at(now_s + step_s, self._end_decode, server)

    def _end_decode(self, now_s: float, server: _Server) -> None:
        still_running = []
        for job in server.running:
            job.num_generated += 1
            if job.num_generated == job.request.output_len:
                server.load_tokens -= job.request.prompt_len + job.request.output_len
                self._finish(now_s, job)
            else:
                still_running.append(job)
        server.running = still_running
        server.busy = False
        reserving, server.reserving = server.reserving, []
        for job in reserving:
            self._reserved(now_s, job)
        if server.running or server.queue:
            self._start_decode(now_s, server)

    def _finish(self, now_s: float, job: _Job) -> None:
        request = job.request
        self._done[job.index] = RequestRecord(
            prompt_len=request.prompt_len, output_len=request.output_len, ttft_s=job.first_token_s - request.arrival_s,
            itl_s=[], e2el_s=now_s - request.arrival_s, success=True, error="", start_s=request.arrival_s)


def simulate(profile: Profile, config: XpYd, requests: list[SimRequest], slos_ms: dict[str, float]) -> dict:
    """The run's figures as `pdserve bench` computes them, from the first arrival to the last
    token, and "slo_attainment", the share of requests within every SLO."""
    records = Simulation(profile, config).run(requests)
    duration_s = max(r.start_s + r.e2el_s for r in records) - min(r.start_s for r in records)
    return {**compute_metrics(records, duration_s, slos_ms).to_dict(), "slo_attainment": attainment(records, slos_ms)}
