"""Fault tests: the real processes of tests/system, one of them killed with SIGKILL mid-request.

`StreamRun` sends requests to the gateway's gRPC front as a client would and records, for each,
its tokens, when each arrived and how it ended, so a test can kill a replica at a chosen moment
and then judge what every client saw."""
from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import pytest

from pdserve.redis_process import start_redis
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.system.conftest import Cluster
from tests.system.faults.netns import NetnsUnavailableError, create_hosts
from tests.system.faults.up_deployment import deployment, fault_model, workload  # noqa: F401  (fixtures)

STREAM_TIMEOUT_S = 180.0


@dataclass
class Outcome:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # of each sampled token, when asked for
    arrival_s: list[float] = field(default_factory=list)  # monotonic time each token arrived
    last: gateway_pb2.GenerateChunk | None = None
    error: grpc.aio.AioRpcError | None = None
    ended_s: float = 0.0


class StreamRun:
    """Streams every request at once; `outcomes[i]` fills in as request i's chunks arrive."""

    def __init__(self, endpoint: str, requests: list[gateway_pb2.GenerateRequest]):
        self.endpoint = endpoint
        self.requests = requests
        self.outcomes = [Outcome() for _ in requests]
        self.victim: str | None = None  # the replica a `during` killed, and when
        self.killed_s = 0.0
        self.struck_request: str | None = None  # the request it aimed at, where it aimed at one

    async def run(self, during=None) -> list[Outcome]:
        """Runs the requests, and `during(self)` (a coroutine function) beside them."""
        async with grpc.aio.insecure_channel(self.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            streams = [asyncio.create_task(self._one(stub, request, outcome))
                       for request, outcome in zip(self.requests, self.outcomes)]
            if during is not None:
                await during(self)
            await asyncio.wait_for(asyncio.gather(*streams), STREAM_TIMEOUT_S)
        return self.outcomes

    async def wait_for(self, condition, what: str, timeout_s: float = 60.0):
        """Waits until `condition(outcomes)` is truthy and returns its value."""
        deadline = time.monotonic() + timeout_s
        while not (value := condition(self.outcomes)):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.02)
        return value

    async def wait_mid_stream(self, min_tokens: int, min_left: int, candidates: Sequence[str] | None = None,
                              lengths: Mapping[str, int] | None = None) -> str:
        """Waits until every stream has its first token and one of `candidates` (request ids, the
        earlier preferred; every request by default) has `min_tokens` and at least `min_left` more
        to come, of `lengths[id]` (what it ends with, say in an unharmed run) or else its
        max_tokens; returns that request. A fault aimed at it then lands mid-stream. Any candidate
        will do because on a loaded machine the last stream can start after the first has ended;
        with every request a candidate and min_tokens + min_left <= its length, the wait ends."""
        index = {request.request_id: i for i, request in enumerate(self.requests)}
        candidates = list(index) if candidates is None else candidates
        lengths = lengths or {request.request_id: request.params.max_tokens for request in self.requests}

        def struck(outcomes: list[Outcome]) -> str | None:
            if not all(outcome.token_ids for outcome in outcomes):
                return None
            return next((request_id for request_id in candidates
                         if min_tokens <= len(outcomes[index[request_id]].token_ids) <= lengths[request_id] - min_left),
                        None)
        return await self.wait_for(struck, f"every stream to start and one of {candidates} to be mid-stream")

    async def _one(self, stub, request, outcome: Outcome) -> None:
        try:
            async for chunk in stub.Generate(request, timeout=STREAM_TIMEOUT_S):
                now_s = time.monotonic()
                outcome.token_ids += chunk.token_ids
                outcome.logprobs += [lp.logprob for lp in chunk.logprobs]
                outcome.arrival_s += [now_s] * len(chunk.token_ids)
                outcome.last = chunk
        except grpc.aio.AioRpcError as exc:
            outcome.error = exc
        outcome.ended_s = time.monotonic()


def greedy_request(request_id: str, prompt_ids: list[int], max_tokens: int) -> gateway_pb2.GenerateRequest:
    return gateway_pb2.GenerateRequest(
        request_id=request_id, prompt_token_ids=gateway_pb2.TokenIds(ids=prompt_ids),
        params=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


def request_info(cluster: Cluster, request_id: str) -> gateway_pb2.RequestInfo:
    async def get():
        async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel:
            return await gateway_pb2_grpc.GatewayStub(channel).GetRequest(
                gateway_pb2.GetRequestRequest(request_id=request_id), timeout=10)
    return asyncio.run(get())


def num_prefills(info: gateway_pb2.RequestInfo) -> int:
    """How many times the request went through prefill: 1, plus one per migration."""
    return sum(change.state == gateway_pb2.REQUEST_STATE_PREFILLING for change in info.history)


def migrations(cluster: Cluster) -> dict[str, float]:
    """The gateway's pdserve:request_migrations_total, by reason."""
    url = f"http://{cluster.gateway.host}:{cluster.gateway.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    pattern = r'^pdserve:request_migrations_total\{[^}]*reason="(\w+)"[^}]*\} (\S+)$'
    return {reason: float(value) for reason, value in re.findall(pattern, text, re.MULTILINE)}


def recovery_s(outcomes: list[Outcome], killed_s: float) -> float:
    """The longest a stream waited, across the kill, for its next token."""
    gaps = [next(t for t in outcome.arrival_s if t > killed_s) - max([t for t in outcome.arrival_s if t <= killed_s],
                                                                     default=killed_s)
            for outcome in outcomes if outcome.arrival_s and outcome.arrival_s[-1] > killed_s]
    return max(gaps, default=0.0)


def wait_until_gone(cluster: Cluster, kind: str, name: str) -> None:
    """Waits for a killed replica's registry entry to expire (its heartbeat TTL)."""
    cluster.wait_until(lambda: name not in cluster.replicas(kind), f"{name} to leave the registry", timeout_s=10.0)


def assert_prefill_kv_free(cluster: Cluster, timeout_s: float = 15.0) -> None:
    def all_free():
        prefills = cluster.replicas("prefill")
        return prefills and all(p["free_blocks"] == p["total_blocks"] > 0 for p in prefills.values())
    cluster.wait_until(all_free, "every prefill replica's KV blocks to be free", timeout_s)


@pytest.fixture(scope="module")
def hosts():
    """Hosts of their own (tests/system/faults/netns.py) for Redis, a gateway, a prefill and two
    decode replicas; skips the test where this machine will not make them."""
    try:
        made = create_hosts(["redis", "gw", "p0", "d0", "d1"])
    except NetnsUnavailableError as error:
        pytest.skip(f"needs network namespaces: {error}")
    yield made
    made.close()


@contextlib.contextmanager
def cluster_on_hosts(hosts, model_dir: str, tmp_path_factory, layout):
    """A cluster with Redis on host "redis" and each (kind, name, host, flags) of `layout` on its
    host, stopped on leaving."""
    # Off loopback, Redis serves only clients that authenticate (or none, in its protected mode).
    redis_server = start_redis(data_dir=tmp_path_factory.mktemp("redis"), password=secrets.token_hex(16),
                               host=hosts.address("redis"), launcher=hosts.launcher("redis"))
    started = Cluster(model_dir, tmp_path_factory.mktemp("cluster"), redis_server.url, secrets.token_hex(32))
    try:
        for kind, name, host, flags in layout:
            started.start(kind, name, *flags, host=hosts.address(host), launcher=hosts.launcher(host))
        started.wait_ready()
        yield started
    finally:
        started.stop()
        redis_server.stop()
