"""The systems `pdserve bench-compare` measures: how each is launched, pinned, checked and stopped.

Every system is one OpenAI-compatible HTTP server on loopback, started as its own process group:

    static          python -m bench.static_server --model DIR --port P --dtype D  (padded HF generate)
    colocated       python -m pdserve serve --model DIR --port P --dtype D        (continuous batching)
    colocated-nocache  the same with --no-enable-prefix-caching
    disaggregated   python -m pdserve up --model DIR --grpc-port G --http-port P --dtype D --prefill N --decode M
                    (its own Redis, N prefill and M decode replicas (default 1 each), the
                    gateway; the gateway's HTTP front; on two or more server CPUs, each replica
                    pinned to its share)
    disaggregated-load  the same with --routing load (the gateway ignores prefix caches)
    vllm            PEER_SCRIPT serve DIR P --dtype D --enable-prefix-caching     (vLLM's CPU build)

Every system loads the weights in the same dtype D, and every system but colocated-nocache
caches prefixes, as pdserve and vLLM do by default. The peer script passes its own `--dtype` and
`--no-enable-prefix-caching` before the extra arguments, and vLLM's parser keeps the last value,
so the appended ones win.

Invariant: every process a system runs sits on the same `Pinning.server_cpus` and sees the same
thread-count environment (`Pinning.server_env`), so the systems differ in software only. The
affinity is set in the child before it executes (children it forks inherit it), never by name.
A system is up when GET /health answers 200 and /v1/models lists a model, within its startup
deadline; stopping sends SIGTERM to its whole process group, then SIGKILL after a grace period.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.errors import BenchConfigError
from pdserve.cluster.health_probe import probe_http
from pdserve.cluster.ports import free_port
from pdserve.engine.errors import PdserveError

LOOPBACK = "127.0.0.1"
SYSTEMS = ("static", "colocated", "colocated-nocache", "disaggregated", "disaggregated-load", "vllm")
DTYPES = ("float32", "bfloat16")
_POLL_INTERVAL_S = 0.5
_PROBE_TIMEOUT_S = 2.0
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class SystemStartError(PdserveError):
    """A system exited or was not healthy before its startup deadline; the message has its log tail."""


class SystemUnavailable(PdserveError):
    """A system that cannot run as configured (no peer script, a dtype it cannot load): skipped."""


@dataclass(frozen=True, slots=True)
class Pinning:
    """Which CPUs the servers and the load-generating client run on.

    Every system's processes get `server_cpus` and `len(server_cpus)` compute threads; the client
    (this process) gets `client_cpus`. The two sets may overlap (then the client competes with
    the server for those cores, the same way for every system).
    """

    server_cpus: tuple[int, ...]
    client_cpus: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.server_cpus or not self.client_cpus:
            raise ValueError("server and client each need at least one CPU")

    @property
    def num_server_threads(self) -> int:
        return len(self.server_cpus)

    def server_env(self) -> dict[str, str]:
        """Thread settings every system's processes get, vLLM's included."""
        threads = str(self.num_server_threads)
        return {
            "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false",
            # vLLM's CPU worker binds one OpenMP thread per listed CPU itself.
            "VLLM_CPU_OMP_THREADS_BIND": cpu_list_text(self.server_cpus),
        }

    def to_dict(self) -> dict:
        return {"server_cpus": list(self.server_cpus), "client_cpus": list(self.client_cpus),
                "server_threads": self.num_server_threads}


def default_pinning(available_cpus: set[int]) -> Pinning:
    """The client on the lowest CPU, every server on all the others (all of them if only one)."""
    cpus = sorted(available_cpus)
    if len(cpus) == 1:
        return Pinning(tuple(cpus), tuple(cpus))
    return Pinning(tuple(cpus[1:]), (cpus[0],))


def parse_systems(text: str) -> tuple[str, ...]:
    """ "colocated,vllm" -> ("colocated", "vllm"): distinct names from SYSTEMS, in the order given."""
    systems = tuple(name.strip() for name in text.split(",") if name.strip())
    if not systems or any(name not in SYSTEMS for name in systems) or len(set(systems)) != len(systems):
        raise BenchConfigError(f"--systems must name distinct systems from {','.join(SYSTEMS)}, got {text!r}")
    return systems


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """ "0,2-3" -> (0, 2, 3), as taskset and the kernel write CPU lists."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(cpus))


def cpu_list_text(cpus: tuple[int, ...]) -> str:
    return ",".join(str(cpu) for cpu in cpus)


@dataclass(frozen=True, slots=True)
class SystemSpec:
    name: str  # one of SYSTEMS
    argv: tuple[str, ...]
    http_port: int
    startup_timeout_s: float
    description: str  # one line for the report

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}/metrics"


@dataclass(frozen=True, slots=True)
class SystemOptions:
    model_dir: Path
    static_max_batch_size: int
    vllm_script: Path | None  # None: the vllm system cannot run
    startup_timeout_s: float
    vllm_startup_timeout_s: float
    dtype: str = "float32"  # one of DTYPES: what every system loads the weights in
    num_decode_replicas: int = 1  # of the disaggregated systems
    num_prefill_replicas: int = 1  # of the disaggregated systems


def system_spec(name: str, options: SystemOptions) -> SystemSpec:
    """How to launch `name`; raises SystemUnavailable when it cannot run with these options."""
    port = free_port(LOOPBACK)
    model = str(options.model_dir)
    python = sys.executable
    dtype = ("--dtype", options.dtype)
    if name == "static":
        return SystemSpec(name, (python, "-m", "pdserve.bench.static_server", "--model", model, "--port", str(port),
                                 "--max-batch-size", str(options.static_max_batch_size), *dtype),
                          port, options.startup_timeout_s,
                          f"static batching: padded transformers generate, batches of up to "
                          f"{options.static_max_batch_size}")
    if name in ("colocated", "colocated-nocache"):
        caching = () if name == "colocated" else ("--no-enable-prefix-caching",)
        return SystemSpec(name, (python, "-m", "pdserve", "serve", "--model", model, "--port", str(port), *dtype,
                                 *caching),
                          port, options.startup_timeout_s,
                          "pdserve serve: one engine, continuous batching with chunked prefill, prefix caching "
                          + ("on" if name == "colocated" else "off"))
    if name in ("disaggregated", "disaggregated-load"):
        routing = "cache-aware" if name == "disaggregated" else "load"
        return SystemSpec(name, (python, "-m", "pdserve", "up", "--model", model,
                                 "--grpc-port", str(free_port(LOOPBACK)), "--http-port", str(port),
                                 "--startup-timeout-s", str(options.startup_timeout_s), *dtype,
                                 "--prefill", str(options.num_prefill_replicas),
                                 "--decode", str(options.num_decode_replicas), "--routing", routing),
                          port, options.startup_timeout_s,
                          f"pdserve up: gateway ({routing} routing) + {options.num_prefill_replicas} prefill + "
                          f"{options.num_decode_replicas} decode + Redis, KV over shared memory")
    if name == "vllm":
        if options.vllm_script is None:
            raise SystemUnavailable("no --peer-vllm script given")
        if not options.vllm_script.is_file():
            raise SystemUnavailable(f"peer script {options.vllm_script} not found")
        return SystemSpec(name, (str(options.vllm_script.resolve()), "serve", model, str(port), *dtype,
                                 "--enable-prefix-caching"),
                          port, options.vllm_startup_timeout_s,
                          "vLLM CPU build, OpenAI server, prefix caching on")
    raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")


class RunningSystem:
    """One started system, running from construction until `stop`, which ends its whole process group."""

    def __init__(self, spec: SystemSpec, pinning: Pinning, log_path: Path, shutdown_timeout_s: float = 30.0):
        self.spec = spec
        self.log_path = log_path
        self._shutdown_timeout_s = shutdown_timeout_s
        env = {**os.environ, **pinning.server_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        with open(log_path, "wb") as log:
            # Run from the log's folder: `python -m` puts the working directory first on sys.path, and
            # a repository checkout there (its kernels/, bench/) would shadow the peer's own imports.
            self._process = subprocess.Popen(
                spec.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=log_path.parent,
                start_new_session=True, preexec_fn=pinned_child_setup(pinning.server_cpus))

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait_ready(self) -> str:
        """Blocks until healthy and serving a model; returns the model id. Raises SystemStartError."""
        deadline = time.monotonic() + self.spec.startup_timeout_s
        health_url = f"http://{LOOPBACK}:{self.spec.http_port}/health"
        while True:
            if self._process.poll() is not None:
                raise SystemStartError(f"{self.spec.name} exited with status {self._process.returncode} "
                                       f"while starting; its last output:\n{self.log_tail()}")
            if probe_http(health_url, _PROBE_TIMEOUT_S).ready:
                model_id = self._served_model_id()
                if model_id is not None:
                    return model_id
            if time.monotonic() >= deadline:
                raise SystemStartError(f"{self.spec.name} was not healthy within "
                                       f"{self.spec.startup_timeout_s:.0f} s; its last output:\n{self.log_tail()}")
            time.sleep(_POLL_INTERVAL_S)

    def scrape_metrics(self) -> str | None:
        """The Prometheus text at /metrics, or None when the system has none."""
        try:
            with urllib.request.urlopen(self.spec.metrics_url, timeout=_PROBE_TIMEOUT_S * 5) as response:
                return response.read().decode(errors="replace") if response.status == 200 else None
        except OSError:
            return None

    def stop(self) -> int | None:
        """SIGTERM to the process group, SIGKILL to what is left after the grace; the exit status."""
        if self._process.poll() is None:
            _signal_group(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=self._shutdown_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self._process.pid, signal.SIGKILL)  # stragglers of a group whose leader left
        try:
            return self._process.wait(timeout=self._shutdown_timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, num_lines: int = 30) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:])

    def _served_model_id(self) -> str | None:
        try:
            with urllib.request.urlopen(f"{self.spec.base_url}/models", timeout=_PROBE_TIMEOUT_S) as response:
                models = json.loads(response.read()).get("data") or []
        except (OSError, ValueError):
            return None
        return models[0]["id"] if models else None


def pin_this_process(cpus: tuple[int, ...]) -> None:
    os.sched_setaffinity(0, cpus)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def pinned_child_setup(cpus: tuple[int, ...]):
    """A preexec_fn: pin to `cpus`, and have the kernel SIGTERM the child if we die."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not after fork

    def setup() -> None:
        os.sched_setaffinity(0, cpus)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))

    return setup
