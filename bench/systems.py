"""The systems a benchmark measures: how each is launched, pinned, checked and stopped.

Every system is one OpenAI-compatible HTTP server on loopback, started as its own process group
(`pdserve up` serves the gateway's gRPC API too, the one system the "grpc" backend can measure):

    colocated      python -m pdserve serve --model DIR --port P --dtype D      (one engine)
    disaggregated  python -m pdserve up --model DIR --http-port P --dtype D --prefill N --decode M
                   (its own Redis, N prefill and M decode replicas, the gateway's HTTP front;
                   on two or more server CPUs each replica pinned to its share)
    vllm           PEER serve DIR P --dtype D --enable-prefix-caching           (vLLM's CPU build)
    llama-cpp      PEER serve FILE.gguf P SLOTS THREADS                         (llama.cpp's server)

The peers are the scripts in ../shared/peers. vLLM's script passes its own `--dtype` and
`--no-enable-prefix-caching` first and vLLM keeps the last value, so the appended ones win;
llama.cpp runs the GGUF as stored (its own quantization, whatever D says).

Invariant: every process a system runs sits on `Pinning.server_cpus` with the same thread-count
environment, so the systems differ in software only; the affinity is set in the child before it
executes. Every system runs from its log's folder, never the checkout, whose top-level packages
(kernels/, bench/) would shadow the peers' own imports. A system is up when GET /health answers
200 and /v1/models lists a model within its deadline; stopping sends SIGTERM to its process
group, then SIGKILL after a grace.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.errors import BenchConfigError
from pdserve.cluster.health_probe import probe_http
from pdserve.cluster.ports import free_port
from pdserve.protocol.errors import PdserveError

LOOPBACK = "127.0.0.1"
SYSTEMS = ("colocated", "disaggregated", "vllm", "llama-cpp")
DTYPES = ("float32", "bfloat16")
LLAMA_CPP_SLOTS = 16
_POLL_INTERVAL_S = 0.5
_PROBE_TIMEOUT_S = 2.0
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class SystemStartError(PdserveError):
    """A system exited or was not healthy before its startup deadline; the message has its log tail."""


class SystemUnavailable(PdserveError):
    """A system that cannot run as configured (no peer script, no GGUF file, no gRPC front): skipped."""


@dataclass(frozen=True, slots=True)
class Pinning:
    """CPUs of the servers (each system gets them all, and as many compute threads) and of the
    load-generating client; the two may overlap, the same way for every system."""

    server_cpus: tuple[int, ...]
    client_cpus: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.server_cpus or not self.client_cpus:
            raise ValueError("server and client each need at least one CPU")

    def server_env(self) -> dict[str, str]:
        threads = str(len(self.server_cpus))
        return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false",
                # vLLM's CPU worker binds one OpenMP thread per listed CPU itself.
                "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, self.server_cpus))}

    def to_dict(self) -> dict:
        return {"server_cpus": list(self.server_cpus), "client_cpus": list(self.client_cpus),
                "server_threads": len(self.server_cpus)}


def all_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


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


@dataclass(frozen=True, slots=True)
class SystemOptions:
    model_dir: Path
    dtype: str = "float32"  # one of DTYPES: what every system loads the weights in
    num_prefill_replicas: int = 1  # of disaggregated
    num_decode_replicas: int = 1  # of disaggregated
    peer_vllm: Path | None = None  # ../shared/peers/vllm-cpu; None: vllm cannot run
    peer_llama_cpp: Path | None = None  # ../shared/peers/llama-cpp
    gguf: Path | None = None  # the file llama-cpp serves
    startup_timeout_s: float = 900.0


@dataclass(frozen=True, slots=True)
class SystemSpec:
    name: str  # one of SYSTEMS
    argv: tuple[str, ...]
    http_port: int
    description: str  # one line for the report
    grpc_port: int | None = None  # the gateway's gRPC API, where the system has one

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}/metrics"

    def target(self, backend: str) -> str:
        """Where a client of `backend` ("openai" or "grpc") sends; SystemUnavailable if nowhere."""
        if backend == "openai":
            return self.base_url
        if self.grpc_port is None:
            raise SystemUnavailable(f"{self.name} has no gRPC front for the grpc backend")
        return f"{LOOPBACK}:{self.grpc_port}"


def system_spec(name: str, options: SystemOptions) -> SystemSpec:
    """How to launch `name`; raises SystemUnavailable when it cannot run with these options."""
    port, model, dtype = free_port(LOOPBACK), str(options.model_dir), ("--dtype", options.dtype)
    if name == "colocated":
        return SystemSpec(name, (sys.executable, "-m", "pdserve", "serve", "--model", model, "--port", str(port),
                                 *dtype), port,
                          "pdserve serve: one engine, continuous batching with chunked prefill, prefix caching on")
    if name == "disaggregated":
        num_p, num_d, grpc_port = options.num_prefill_replicas, options.num_decode_replicas, free_port(LOOPBACK)
        return SystemSpec(name, (sys.executable, "-m", "pdserve", "up", "--model", model,
                                 "--grpc-port", str(grpc_port), "--http-port", str(port),
                                 "--startup-timeout-s", str(options.startup_timeout_s), *dtype,
                                 "--prefill", str(num_p), "--decode", str(num_d)), port,
                          f"pdserve up: gateway + {num_p} prefill + {num_d} decode + Redis, KV over shared memory",
                          grpc_port)
    if name == "vllm":
        return SystemSpec(name, (peer_script(options.peer_vllm, "--peer-vllm"), "serve", model, str(port), *dtype,
                                 "--enable-prefix-caching"), port, "vLLM CPU build, OpenAI server, prefix caching on")
    if name == "llama-cpp":
        script = peer_script(options.peer_llama_cpp, "--peer-llama-cpp")
        if options.gguf is None or not options.gguf.is_file():
            raise SystemUnavailable(f"llama-cpp needs --gguf FILE (got {options.gguf})")
        return SystemSpec(name, (script, "serve", str(options.gguf.resolve()), str(port), str(LLAMA_CPP_SLOTS),
                                 str(len(os.sched_getaffinity(0)))), port,
                          f"llama.cpp server (xllamacpp), {LLAMA_CPP_SLOTS} slots, the GGUF as stored")
    raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")


def peer_script(path: Path | None, flag: str) -> str:
    """A peer's script; SystemUnavailable without one."""
    if path is None:
        raise SystemUnavailable(f"no {flag} script given")
    if not path.is_file():
        raise SystemUnavailable(f"peer script {path} not found")
    return str(path.resolve())


class RunningSystem:
    """One started system, running from construction until `stop`, which ends its whole process group."""

    def __init__(self, spec: SystemSpec, pinning: Pinning, log_path: Path, startup_timeout_s: float,
                 shutdown_timeout_s: float = 30.0):
        self.spec, self.log_path = spec, log_path
        self._startup_timeout_s, self._shutdown_timeout_s = startup_timeout_s, shutdown_timeout_s
        self._process = launch(spec.argv, pinning.server_cpus, log_path)

    def wait_ready(self) -> str:
        """Blocks until healthy and serving a model; returns the model id. Raises SystemStartError."""
        deadline = time.monotonic() + self._startup_timeout_s
        while True:
            if self._process.poll() is not None:
                raise SystemStartError(f"{self.spec.name} exited with status {self._process.returncode} "
                                       f"while starting; its last output:\n{self.log_tail()}")
            if probe_http(f"http://{LOOPBACK}:{self.spec.http_port}/health", _PROBE_TIMEOUT_S).ready:
                model_id = self._served_model_id()
                if model_id is not None:
                    return model_id
            if time.monotonic() >= deadline:
                raise SystemStartError(f"{self.spec.name} was not healthy within {self._startup_timeout_s:.0f} s; "
                                       f"its last output:\n{self.log_tail()}")
            time.sleep(_POLL_INTERVAL_S)

    def stop(self) -> int | None:
        """SIGTERM to the process group, SIGKILL to what is left after the grace; the exit status."""
        if self._process.poll() is None:
            _signal_group(self._process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=self._shutdown_timeout_s)
        _signal_group(self._process.pid, signal.SIGKILL)  # stragglers of a group whose leader left
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self._process.wait(timeout=self._shutdown_timeout_s)
        return None

    def log_tail(self, num_lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    def _served_model_id(self) -> str | None:
        try:
            with urllib.request.urlopen(f"{self.spec.base_url}/models", timeout=_PROBE_TIMEOUT_S) as response:
                models = json.loads(response.read()).get("data") or []
        except (OSError, ValueError):
            return None
        return models[0]["id"] if models else None


@dataclass(frozen=True, slots=True)
class Served:
    """A system that is up: where a client of `backend` sends, and the model id it serves."""

    spec: SystemSpec
    model_id: str
    backend: str = "openai"

    @property
    def target(self) -> str:
        return self.spec.target(self.backend)


@contextlib.contextmanager
def started(name: str, options: SystemOptions, pinning: Pinning, log_dir: Path,
            backend: str = "openai") -> Iterator[Served]:
    """`name` running and ready while the block runs, stopped after it (logs/<name>.log).
    Raises SystemUnavailable before starting anything (also when it has no front for
    `backend`), SystemStartError when it never came up."""
    spec = system_spec(name, options)
    spec.target(backend)
    system = RunningSystem(spec, pinning, log_dir / f"{name}.log", options.startup_timeout_s)
    try:
        yield Served(spec, system.wait_ready(), backend)
    finally:
        system.stop()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def launch(argv, cpus: tuple[int, ...], log_path: Path) -> subprocess.Popen:
    """`argv` as its own process group in `log_path`'s folder, its output in that file, pinned
    to `cpus` with their thread counts (`Pinning.server_env`); the kernel SIGTERMs it if we die."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not after fork

    def setup() -> None:
        os.sched_setaffinity(0, cpus)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))

    env = {**os.environ, **Pinning(cpus, cpus).server_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=log_path.parent, start_new_session=True, preexec_fn=setup)


def add_system_arguments(parser, model: bool = True) -> None:
    """The flags every workload that starts systems shares (`model`: with --model SPEC)."""
    if model:
        parser.add_argument("--model", metavar="SPEC",
                            help="what `pdserve up --model` takes (default: SmolLM2-135M-Instruct, fetched once)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="what every system loads the weights in")
    parser.add_argument("--prefill-replicas", type=int, default=1, metavar="N", help="of disaggregated (default 1)")
    parser.add_argument("--decode-replicas", type=int, default=1, metavar="M", help="of disaggregated (default 1)")
    parser.add_argument("--peer-vllm", type=Path, metavar="SCRIPT",
                        help="../shared/peers/vllm-cpu (its `serve` and `python`); without it vllm is skipped")
    parser.add_argument("--peer-llama-cpp", type=Path, metavar="SCRIPT", help="../shared/peers/llama-cpp")
    parser.add_argument("--gguf", type=Path, metavar="FILE", help="the GGUF file llama-cpp serves")
    parser.add_argument("--server-cpus", type=parse_cpu_list, metavar="LIST",
                        help="CPUs every system runs on (default: every usable CPU)")
    parser.add_argument("--client-cpus", type=parse_cpu_list, metavar="LIST",
                        help="CPUs of the client (default: every usable CPU, shared with the servers)")
    parser.add_argument("--startup-timeout-s", type=float, default=900.0)


def options_from(args) -> tuple[SystemOptions, Pinning]:
    """The systems' options and pinning from `add_system_arguments`' flags; resolves the model."""
    from pdserve.checkpoints.model_ref import resolve_model

    model_dir = resolve_model(args.model, os.environ).model_dir.resolve()
    options = SystemOptions(model_dir, args.dtype, args.prefill_replicas, args.decode_replicas, args.peer_vllm,
                            args.peer_llama_cpp, args.gguf, args.startup_timeout_s)
    return options, Pinning(args.server_cpus or all_cpus(), args.client_cpus or all_cpus())
