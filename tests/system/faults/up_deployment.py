"""`pdserve up` as a real process tree, for the supervision and drain tests: start it, find its
children by pid, read its registry, probe its replicas (with the certificate files its children
were given: up runs internal gRPC on mutual TLS), and drive greedy streams through its gateway.
Its fixtures are made visible to tests/system/faults by conftest.py."""
from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import redis
import torch

from pdserve.cluster.health_probe import probe_grpc
from pdserve.cluster.internal_tls import CA_ENV, CERT_ENV, KEY_ENV, InternalTls, InternalTlsFiles
from pdserve.engine.config import ModelConfig
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.helpers import (ENGINE_FLAGS, children_of, environ_of, free_port, is_alive, up_redis_url,
                           wait_for_endpoints)

STARTUP_DEADLINE_S = 300.0
STOP_DEADLINE_S = 60.0
NUM_PROMPTS = 6


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


@dataclass
class Up:
    process: subprocess.Popen
    log_path: Path
    grpc_port: int
    redis_url: str = ""

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self) -> dict[str, int]:
        """The live children of `up` by name (replica id, "gateway", or the Redis server's name): pid."""
        found = {}
        for pid in children_of(self.process.pid):
            argv = cmdline(pid)
            if not is_alive(pid) or not argv:
                continue
            if "--replica-id" in argv:
                found[argv[argv.index("--replica-id") + 1]] = pid
            elif argv[3:4] == ["gateway"]:
                found["gateway"] = pid
            else:
                found[Path(argv[0]).name] = pid
        return found

    def serves(self, endpoint: str) -> bool:
        """The replica at `endpoint` says SERVING to a probe with the deployment's certificate."""
        return probe_grpc(endpoint, 1.0, self.internal_tls).ready

    @functools.cached_property
    def internal_tls(self) -> InternalTls | None:
        """A certificate up gave one of its children (files that last as long as up); None
        where it runs without TLS."""
        for pid in self.children().values():
            if CERT_ENV in (environ := environ_of(pid)):
                return InternalTlsFiles(*(Path(environ[name]) for name in (CA_ENV, CERT_ENV, KEY_ENV))).load()
        return None

    def registry(self, kind: str) -> dict[str, dict]:
        client = redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=5)
        try:
            entries = {}
            for key in client.scan_iter(f"replica:{kind}:*"):
                if value := client.get(key):
                    entries[key.split(":", 2)[2]] = json.loads(value)
            return entries
        finally:
            client.close()


def start_up(tmp_path: Path, model_dir: str, *flags: str) -> Up:
    """`pdserve up` on free ports; returns once it has printed its endpoints."""
    grpc_port = free_port()
    log_path = tmp_path / "up.log"
    environ = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pdserve", "up", "--model", model_dir, "--grpc-port", str(grpc_port),
             "--http-port", str(free_port()), *ENGINE_FLAGS, *flags],
            stdout=subprocess.PIPE, stderr=log, text=True, env=environ, start_new_session=True)
    up = Up(process, log_path, grpc_port)
    try:
        endpoints = wait_for_endpoints(process, STARTUP_DEADLINE_S)
    except AssertionError as not_up:
        stop_up(up)
        raise AssertionError(f"{not_up}:\n{up.log()[-5000:]}") from None
    if "the URL with its password" in endpoints:  # up's own Redis, not one given with --redis-url
        up.redis_url = up_redis_url(endpoints)
    return up


def stop_up(up: Up) -> None:
    if up.process.poll() is None:
        up.process.send_signal(signal.SIGINT)
        try:
            up.process.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            up.process.kill()
            up.process.wait(timeout=STOP_DEADLINE_S)


@pytest.fixture(scope="package")
def fault_model(e2e_model) -> str:
    return e2e_model


@pytest.fixture(scope="package")
def workload(fault_model, hf_greedy):
    """Greedy cases (prompt ids, max_tokens) and transformers' output for each."""
    vocab_size = ModelConfig.from_dir(fault_model).vocab_size
    generator = torch.Generator().manual_seed(11)
    cases = [(torch.randint(0, vocab_size, (int(n),), generator=generator).tolist(), 96 + 16 * i)
             for i, n in enumerate(torch.randint(4, 60, (NUM_PROMPTS,), generator=generator))]
    return cases, hf_greedy(fault_model, cases)


@pytest.fixture(scope="package")
def deployment(fault_model, tmp_path_factory):
    """One `pdserve up --prefill 1 --decode 2` for the fault tests that leave it whole again."""
    up = start_up(tmp_path_factory.mktemp("up"), fault_model, "--prefill", "1", "--decode", "2")
    try:
        yield up
    finally:
        stop_up(up)
        print(up.log()[-20000:])


@dataclass
class Outcome:
    case: int
    token_ids: list[int] | None  # None: it failed
    decode_replica: str = ""
    error: str = ""


async def generate(stub, case: int, prompt: list[int], max_tokens: int) -> Outcome:
    request = gateway_pb2.GenerateRequest(
        prompt_token_ids=gateway_pb2.TokenIds(ids=prompt),
        params=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    token_ids, request_id = [], ""
    try:
        async for chunk in stub.Generate(request, timeout=120):
            token_ids += chunk.token_ids
            request_id = chunk.request_id
        info = await stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=request_id), timeout=10)
    except grpc.aio.AioRpcError as error:
        return Outcome(case, None, error=f"{error.code().name}: {error.details()}")
    return Outcome(case, token_ids, info.decode_replica)


class SteadyLoad:
    """`num_streams` clients, each sending the workload's cases one after another until stopped."""

    def __init__(self, gateway: str, cases, num_streams: int):
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(gateway, cases, num_streams)),
                                        daemon=True)

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=180)
        assert not self._thread.is_alive(), "load did not stop"

    async def _run(self, gateway: str, cases, num_streams: int) -> None:
        async with grpc.aio.insecure_channel(gateway) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)

            async def client(first: int) -> None:
                case = first
                while not self._stop.is_set():
                    prompt, max_tokens = cases[case % len(cases)]
                    self.outcomes.append(await generate(stub, case % len(cases), prompt, max_tokens))
                    case += 1

            await asyncio.gather(*(client(i) for i in range(num_streams)))


def wrong_outputs(outcomes: list[Outcome], expected: list[list[int]]) -> list[Outcome]:
    return [o for o in outcomes if o.token_ids is not None and o.token_ids != expected[o.case]]
