"""tests/system drives whole deployments, so no one package owns its tests: real processes on
loopback, a private redis-server and pdserve replicas started with the same command line users run
(`python -m pdserve prefill|decode|gateway ...`), or `pdserve up|serve` itself. Each module carries
its tier marker (e2e here, faults in faults/, where replicas are killed, cut off or hosted apart).

A cluster made with `internal_tls=True` runs internal gRPC on mutual TLS: a CA of its own issues
each service a certificate naming the host it binds, and the tests' own internal calls and probes
present one more, "e2e-test"."""
from __future__ import annotations

import asyncio
import functools
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import redis

from pdserve.cluster.certificates import CertificateAuthority
from pdserve.cluster.health_probe import probe
from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.internal_tls import InternalTls, InternalTlsFiles
from pdserve.redis_process import start_redis
from tests.helpers import ENGINE_DTYPE, KV_CACHE_MEMORY_BYTES, free_port, wait_until

START_TIMEOUT_S = 180.0
TEST_MODEL_ENV = "PDSERVE_TEST_MODEL"


@dataclass
class Service:
    kind: str
    name: str
    process: subprocess.Popen
    port: int
    log_path: Path
    http_port: int = 0  # gateway only
    host: str = "127.0.0.1"  # the address it binds and advertises
    flags: tuple[str, ...] = ()  # its own, as given to Cluster.start

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def log_tail(self, num_lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])


@dataclass
class Cluster:
    model_dir: str
    work_dir: Path
    redis_url: str
    internal_secret: str  # the deployment's, which every service gets in its environment
    tls_ca: CertificateAuthority | None = None  # None: internal gRPC is plaintext
    services: list[Service] = field(default_factory=list)

    def start(self, kind: str, name: str, *flags: str, host: str = "127.0.0.1",
              launcher: Sequence[str] = ()) -> Service:
        """Starts `python -m pdserve KIND` bound to `host`, through `launcher` (a prefix of its
        command line: tests/system/faults/netns.py runs it on a host of its own that way). A replica
        gets the tests' KV pool and dtype (tests.helpers) unless its flags give them."""
        port, http_port = free_port(), free_port()
        port_flags = ["--grpc-port", str(port), "--http-port", str(http_port)] if kind == "gateway" \
            else ["--port", str(port), "--replica-id", name]
        engine_flags = []
        if kind != "gateway":
            if not {"--kv-cache-memory", "--num-gpu-blocks"} & set(flags):
                engine_flags += ["--kv-cache-memory", str(KV_CACHE_MEMORY_BYTES)]
            if "--dtype" not in flags:
                engine_flags += ["--dtype", ENGINE_DTYPE]
        log_path = self.work_dir / f"{name}.log"
        command = [*launcher, sys.executable, "-m", "pdserve", kind, "--model", self.model_dir,
                   "--redis-url", self.redis_url, "--host", host, *port_flags, *engine_flags, *flags]
        env = {**os.environ, "PDSERVE_INTERNAL_SECRET": self.internal_secret}
        if self.tls_ca is not None:
            env |= self.tls_files(name, host).env()
        with open(log_path, "a") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        service = Service(kind, name, process, port, log_path, http_port if kind == "gateway" else 0, host, flags)
        self.services.append(service)
        return service

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = list(self.services)
        while pending:
            for service in list(pending):
                if service.process.poll() is not None:
                    raise RuntimeError(f"{service.name} exited:\n{service.log_tail()}")
                if probe(service.endpoint, 1.0, None if service.kind == "gateway" else self.client_tls).ready:
                    pending.remove(service)
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready: {[s.name for s in pending]}")
            time.sleep(0.2)
        self.wait_until(lambda: len(self.replicas("prefill")) == self.count("prefill")
                        and len(self.replicas("decode")) == self.count("decode"), "replicas registered")

    def internal_channel(self, service: Service, caller_id: str = "e2e-test") -> grpc.aio.Channel:
        """A channel to an internal service that presents the deployment secret, and the tests'
        certificate where the cluster runs TLS, as a gateway's does."""
        return InternalAuth(self.internal_secret.encode(), caller_id, tls=self.client_tls).channel(service.endpoint)

    @functools.cached_property
    def client_tls(self) -> InternalTls | None:
        """What the tests' own internal calls and probes present; None without TLS."""
        return None if self.tls_ca is None else self.tls_files("e2e-test", "127.0.0.1").load()

    def tls_files(self, name: str, host: str) -> InternalTlsFiles:
        """A new certificate from the cluster's CA for `name`, naming `host`, and its files."""
        directory = self.work_dir / "tls"
        directory.mkdir(mode=0o700, exist_ok=True)
        issued = self.tls_ca.issue(name, [host])
        paths = InternalTlsFiles(directory / "ca.pem", directory / f"{name}.pem", directory / f"{name}-key.pem")
        paths.ca_path.write_bytes(self.tls_ca.cert_pem)
        paths.cert_path.write_bytes(issued.cert_pem)
        paths.key_path.touch(mode=0o600)
        paths.key_path.write_bytes(issued.key_pem)
        return paths

    def count(self, kind: str) -> int:
        return sum(1 for s in self.services if s.kind == kind and s.process.poll() is None)

    @property
    def gateway(self) -> Service:
        return next(s for s in self.services if s.kind == "gateway")

    def replicas(self, kind: str) -> dict[str, dict]:
        """The registry as the gateway sees it: replica id -> its last heartbeat."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=5)
        try:
            entries = {}
            for key in client.scan_iter(f"replica:{kind}:*"):
                value = client.get(key)
                if value:
                    entries[key.split(":", 2)[2]] = json.loads(value)
            return entries
        finally:
            client.close()

    def wait_until(self, condition, what: str, timeout_s: float = 15.0) -> None:
        wait_until(condition, what, timeout_s, poll_s=0.1)

    def assert_all_kv_free(self, timeout_s: float = 15.0) -> None:
        """Every live decode replica reports all its blocks free (no reservation, no leak)."""
        def all_free():
            decodes = self.replicas("decode")
            return decodes and all(d["free_blocks"] == d["total_blocks"] > 0 for d in decodes.values())
        try:
            self.wait_until(all_free, "every decode replica's KV blocks to be free", timeout_s)
        except AssertionError:
            raise AssertionError(f"KV blocks not returned: {self.replicas('decode')}") from None

    def kill(self, service: Service) -> None:
        service.process.send_signal(signal.SIGKILL)
        service.process.wait(timeout=10)

    def restart(self, service: Service, drain_timeout_s: float = 60.0) -> Service:
        """Stops `service` with SIGTERM (it drains first) and starts it again with its flags on
        fresh ports (its log goes on in the same file); returns it once it serves again."""
        service.process.send_signal(signal.SIGTERM)
        service.process.wait(timeout=drain_timeout_s)
        self.services.remove(service)
        started = self.start(service.kind, service.name, *service.flags, host=service.host)
        self.wait_ready()
        return started

    def stop(self) -> None:
        for service in self.services:
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
        for service in self.services:
            try:
                service.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                service.process.kill()


@pytest.fixture(scope="session")
def e2e_model(tiny_model) -> str:
    """The tiny random model of the default shape `pdserve up` serves, or the model folder named by
    $PDSERVE_TEST_MODEL (to run a system or fault test on a real checkpoint)."""
    return os.environ.get(TEST_MODEL_ENV) or tiny_model()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = start_redis(data_dir=tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def make_cluster(e2e_model, redis_server, tmp_path_factory):
    """Starts clusters on one Redis (distinct db per cluster) and stops them after the module;
    with `internal_tls`, on mutual TLS."""
    clusters = []

    def make(layout: list[tuple[str, str, tuple[str, ...]]], internal_tls: bool = False) -> Cluster:
        db = len(clusters) + 1
        url = redis_server.url.rsplit("/", 1)[0] + f"/{db}"
        tls_ca = CertificateAuthority("e2e CA", valid_days=1) if internal_tls else None
        cluster = Cluster(e2e_model, tmp_path_factory.mktemp("cluster"), url, secrets.token_hex(32), tls_ca)
        clusters.append(cluster)
        for kind, name, flags in layout:
            cluster.start(kind, name, *flags)
        cluster.wait_ready()
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


def run(coro):
    return asyncio.run(coro)
