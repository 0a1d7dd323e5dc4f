"""`pdserve up`: the whole system on one machine, as child processes of this one.

    Redis (own, unless --redis-url) ─┐
    prefill-0 … prefill-{N-1}       ├─ all started at once, each on a free loopback port
    decode-0 … decode-{M-1}         │  (the gateway on --grpc-port / --http-port)
    gateway ────────────────────────┘

Up means: every child's gRPC health says SERVING and the gateway's HTTP /health answers 200
(it sees live replicas), within one startup deadline. A child that exits before then aborts the
start, showing its last output lines. Then the endpoints are printed to stdout.

Invariant: nothing outlives `up`. On Ctrl-C or SIGTERM, on a failed start, or when any child
dies, every child gets SIGTERM, those still running at the shutdown deadline get SIGKILL, and
then our Redis stops. Children run in their own sessions, so a terminal's Ctrl-C reaches only
`up`, which stops them in that order; and the kernel sends them SIGTERM should `up` itself die.
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc

from cluster.health_probe import probe_grpc, probe_http
from cluster.ports import free_port
from engine.errors import PdserveError
from engine.tiny_model_cache import cache_root, ensure_tiny_model
from pdserve.cpu_placement import cpu_list_arg, split_cpus
from pdserve.redis_process import RedisStartError, start_redis

LOOPBACK = "127.0.0.1"
_POLL_INTERVAL_S = 0.2
_PROBE_TIMEOUT_S = 1.0
_REDIS_START_TIMEOUT_S = 10.0
_NUM_LAST_LINES = 30
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class UpError(PdserveError):
    """The system could not be started; the message says what to do about it."""


class StopRequested(PdserveError):
    """Ctrl-C or SIGTERM arrived while starting."""


@dataclass(frozen=True, slots=True)
class UpConfig:
    model_dir: Path | None  # None: the cached tiny demo model
    num_prefill: int
    num_decode: int
    redis_url: str | None  # None: start our own Redis
    transport: str
    device: str
    dtype: str  # of the replicas' weights and KV: "auto" or a torch dtype name
    host: str  # the gateway's bind address
    grpc_port: int
    http_port: int
    startup_timeout_s: float
    shutdown_timeout_s: float


@dataclass(frozen=True, slots=True)
class ChildSpec:
    name: str  # prefix of its log lines, e.g. "decode-1"
    argv: tuple[str, ...]
    grpc_target: str  # "host:port" of its health service
    http_health_url: str | None = None  # also probed, when set


class Child:
    """One child process. Its merged stdout and stderr are copied line by line to `log`, each
    line prefixed with the child's name, and the last lines are kept for error messages."""

    def __init__(self, spec: ChildSpec, log: TextIO, log_lock: threading.Lock, preexec_fn):
        self.spec = spec
        self.last_probe = "not probed yet"
        self._last_lines: collections.deque[str] = collections.deque(maxlen=_NUM_LAST_LINES)
        self._process = subprocess.Popen(
            spec.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=preexec_fn)
        self._copier = threading.Thread(target=self._copy_output, args=(log, log_lock),
                                        name=f"log-{spec.name}", daemon=True)
        self._copier.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def exit_code(self) -> int | None:
        return self._process.poll()

    def last_lines(self) -> str:
        self._copier.join(timeout=1.0)  # let the output of an exited child drain
        return "\n".join(self._last_lines)

    def probe_ready(self) -> bool:
        result = probe_grpc(self.spec.grpc_target, _PROBE_TIMEOUT_S)
        if result.ready and self.spec.http_health_url is not None:
            result = probe_http(self.spec.http_health_url, _PROBE_TIMEOUT_S)
        self.last_probe = result.detail
        return result.ready

    def terminate(self) -> None:
        if self.exit_code is None:
            self._process.terminate()

    def kill(self) -> None:
        if self.exit_code is None:
            self._process.kill()

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self._process.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def _copy_output(self, log: TextIO, log_lock: threading.Lock) -> None:
        for raw_line in self._process.stdout:
            line = raw_line.decode(errors="replace").rstrip("\n")
            self._last_lines.append(line)
            with log_lock:
                log.write(f"{self.spec.name:<10}| {line}\n")
                log.flush()
        self._process.stdout.close()


class ProcessGroup:
    """Children started together, waited on together and stopped together."""

    def __init__(self, log: TextIO):
        self.children: list[Child] = []
        self._log = log
        self._log_lock = threading.Lock()
        self._preexec_fn = _terminate_with_parent_fn()

    def start(self, spec: ChildSpec) -> Child:
        child = Child(spec, self._log, self._log_lock, self._preexec_fn)
        self.children.append(child)
        return child

    def first_exited(self) -> Child | None:
        return next((child for child in self.children if child.exit_code is not None), None)

    def wait_ready(self, deadline: float, stop: threading.Event) -> None:
        """Returns once every child is ready; raises UpError if one exits or time runs out."""
        pending = list(self.children)
        while True:
            if (exited := self.first_exited()) is not None:
                raise exited_error(exited, "while starting")
            pending = [child for child in pending if not child.probe_ready()]
            if not pending:
                return
            if stop.is_set():
                raise StopRequested("stop requested while starting")
            if time.monotonic() >= deadline:
                waiting = ", ".join(f"{child.spec.name} ({child.last_probe})" for child in pending)
                raise UpError(f"not ready before the startup deadline: {waiting}")
            stop.wait(_POLL_INTERVAL_S)

    def stop(self, timeout_s: float) -> None:
        """SIGTERM to all, then SIGKILL to those still running after timeout_s."""
        for child in self.children:
            child.terminate()
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            if child.wait(deadline - time.monotonic()) is None:
                self._say(f"{child.spec.name} did not stop within {timeout_s} s; killing it")
                child.kill()
                child.wait(timeout_s)

    def _say(self, message: str) -> None:
        with self._log_lock:
            self._log.write(f"{'up':<10}| {message}\n")
            self._log.flush()


def run_up(config: UpConfig, out: TextIO, log: TextIO) -> int:
    """Starts everything, prints the endpoints to `out`, serves until a stop signal; exit status."""
    stop = threading.Event()
    previous_handlers = {signum: signal.signal(signum, lambda *_: stop.set())
                         for signum in (signal.SIGINT, signal.SIGTERM)}
    run_dir = Path(tempfile.mkdtemp(prefix="pdserve-up-"))
    group = ProcessGroup(log)
    redis = None
    try:
        _check_port_free(config.host, config.grpc_port, "--grpc-port")
        _check_port_free(config.host, config.http_port, "--http-port")
        model_dir = config.model_dir or ensure_tiny_model(cache_root(os.environ))
        redis_url, redis_shown = config.redis_url, config.redis_url
        if redis_url is None:
            redis = start_redis(data_dir=run_dir / "redis", timeout_s=_REDIS_START_TIMEOUT_S)
            redis_url, redis_shown = redis.url, f"{redis.url}  ({redis.server})"
        for spec in child_specs(config, model_dir, redis_url):
            group.start(spec)
        group.wait_ready(time.monotonic() + config.startup_timeout_s, stop)
        model_id = served_model_id(gateway_target(config), _PROBE_TIMEOUT_S)
        out.write(endpoints_text(config, model_dir, model_id, redis_shown))
        out.flush()
        while not stop.wait(_POLL_INTERVAL_S):
            if (exited := group.first_exited()) is not None:
                raise exited_error(exited, "while serving")
        return 0
    except StopRequested:
        return 0
    except (UpError, RedisStartError, grpc.RpcError) as error:
        log.write(f"pdserve up: {error}\n")
        return 1
    finally:
        log.write("pdserve up: stopping\n")
        group.stop(config.shutdown_timeout_s)
        if redis is not None:
            redis.stop(timeout_s=config.shutdown_timeout_s)
        shutil.rmtree(run_dir, ignore_errors=True)
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)


def exited_error(child: Child, when: str) -> UpError:
    return UpError(f"{child.spec.name} exited with status {child.exit_code} {when}; "
                   f"its last output:\n{child.last_lines()}")


def served_model_id(target: str, timeout_s: float) -> str:
    """The id the gateway serves its model under (what OpenAI requests name as "model")."""
    from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        response = gateway_pb2_grpc.GatewayStub(channel).ListModels(
            gateway_pb2.ListModelsRequest(), timeout=timeout_s)
    if not response.models:
        raise UpError(f"the gateway at {target} lists no model")
    return response.models[0].id


def gateway_target(config: UpConfig) -> str:
    return f"{_reachable(config.host)}:{config.grpc_port}"


def child_specs(config: UpConfig, model_dir: Path, redis_url: str) -> list[ChildSpec]:
    """Prefill replicas, decode replicas, then the gateway: `python -m pdserve <service> ...`.
    On CPU each replica gets its own CPUs (see cpu_placement)."""
    pdserve = (sys.executable, "-m", "pdserve")
    common = ("--model", str(model_dir), "--redis-url", redis_url)
    replicas = [(kind, index) for kind, count in (("prefill", config.num_prefill), ("decode", config.num_decode))
                for index in range(count)]
    cpu_sets = split_cpus(sorted(os.sched_getaffinity(0)), len(replicas)) if config.device == "cpu" else None
    specs = []
    for i, (kind, index) in enumerate(replicas):
        port = free_port(LOOPBACK)
        pinning = ("--cpus", cpu_list_arg(cpu_sets[i])) if cpu_sets else ()
        specs.append(ChildSpec(
            name=f"{kind}-{index}",
            argv=(*pdserve, kind, *common, "--host", LOOPBACK, "--port", str(port), "--replica-id", f"{kind}-{index}",
                  "--device", config.device, "--dtype", config.dtype, *pinning),
            grpc_target=f"{LOOPBACK}:{port}"))
    specs.append(ChildSpec(
        name="gateway",
        argv=(*pdserve, "gateway", *common, "--host", config.host,
              "--grpc-port", str(config.grpc_port), "--http-port", str(config.http_port),
              "--transport", config.transport),
        grpc_target=gateway_target(config),
        http_health_url=f"http://{_reachable(config.host)}:{config.http_port}/health"))
    return specs


def endpoints_text(config: UpConfig, model_dir: Path, model_id: str, redis: str) -> str:
    grpc_target = gateway_target(config)
    http_base = f"http://{_reachable(config.host)}:{config.http_port}"
    body = json.dumps({"model": model_id, "prompt": "hello", "max_tokens": 16})
    return (
        f"pdserve is up: gRPC {grpc_target}, HTTP {http_base}/v1\n"
        f"  gateway gRPC     {grpc_target}  (pdserve.v1.Gateway)\n"
        f"  OpenAI HTTP      {http_base}/v1\n"
        f"  Redis            {redis}\n"
        f"  model            {model_dir}\n"
        f"  replicas         {config.num_prefill} prefill, {config.num_decode} decode "
        f"on {config.device}, transport {config.transport}\n"
        f"Try:\n"
        f"  pdserve generate \"hello\" --gateway {grpc_target}\n"
        f"  curl -s {http_base}/v1/completions -H 'Content-Type: application/json' -d '{body}'\n"
        f"Ctrl-C stops everything.\n")


def _check_port_free(host: str, port: int, flag: str) -> None:
    # A plain bind (no SO_REUSEPORT) fails if anything listens there, gRPC servers included.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            raise UpError(f"port {port} on {host} is not available ({error.strerror}); "
                          f"pick another with {flag} PORT") from error


def _reachable(host: str) -> str:
    """The address a local client dials for a server bound to `host`."""
    return LOOPBACK if host in ("0.0.0.0", "") else host


def _terminate_with_parent_fn():
    """A preexec_fn asking the kernel to SIGTERM the child when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not after fork
    prctl = libc.prctl

    def terminate_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))

    return terminate_with_parent
