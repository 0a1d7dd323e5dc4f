"""`pdserve up`: the whole system on one machine, as child processes of this one.

    Redis (own, unless --redis-url) ─┐
    prefill-0 … prefill-{N-1}       ├─ all started at once, each on a free loopback port
    decode-0 … decode-{M-1}         │  (the gateway on --grpc-port / --http-port)
    gateway ────────────────────────┘

Up means: every child's gRPC health says SERVING and the gateway's HTTP /health answers 200
(it sees live replicas), within one startup deadline. A child that exits before then aborts the
start, showing its last output lines. Then the endpoints are printed to stdout.

The log (stderr) reads one line per process and stage: up's own (fetching or converting the
model, each child started), then each replica's loading and ready lines (cluster/startup_log.py)
and the gateway's; health probes leave no access-log lines (gateway/front/http_server.py).

Security: `up` makes a fresh deployment secret (internal calls and registry entries carry it,
cluster/internal_auth.py) and, for its own Redis, a password; children get both, and the Redis
URL, in their environment, never on argv, where any local user reads them. Neither is ever
printed: the Redis URL is shown without its password, and the whole URL of our own Redis is in
a file only its owner reads, named in the endpoints. Replicas bind to loopback only; the gateway
alone listens on --host. Unless --no-internal-tls, `up` also makes a CA for the run and a
certificate for each child and for its own health probes (cluster/certificates.py), in the run's
folder, which only its owner enters and which goes when `up` ends: internal gRPC runs on mutual
TLS (cluster/internal_tls.py), and children inherit no other TLS settings.

Invariant: while `up` runs, so does the deployment, and nothing outlives `up`. A child that
dies is restarted and everything else keeps serving (see supervisor: what restarts how, and
the few failures that stop the deployment). On Ctrl-C or SIGTERM, on a failed start, or when
the deployment cannot go on, every child gets SIGTERM, those still running at the shutdown
deadline get SIGKILL, and then our Redis stops. Should `up` itself die, even by SIGKILL, the
kernel sends every child, Redis included, SIGTERM (parent_death).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc

from pdserve.checkpoints.errors import CheckpointError
from pdserve.checkpoints.model_ref import ResolvedModel, resolve_model
from pdserve.child_process import ChildSpec, UpLog, UpLogHandler
from pdserve.cluster.certificates import write_certificates
from pdserve.cluster.internal_tls import TLS_ENV_VARS, InternalTls, InternalTlsFiles
from pdserve.cluster.ports import free_port
from pdserve.cluster.service_args import REDIS_URL_ENV, SECRET_ENV
from pdserve.cpu_placement import cpu_list_arg, split_cpus
from pdserve.engine.core_lease import create_lease
from pdserve.engine.cpu_kv_memory import HostMemory, kv_memory_bytes, read_host_memory
from pdserve.engine.step_budget import DEFAULT_MAX_STEP_MS
from pdserve.gateway.front.api_keys import ENV_VAR as API_KEY_ENV_VAR
from pdserve.gateway.front.tool_parsers import DEFAULT_TOOL_CALL_PARSER
from pdserve.gpu_placement import PlacementError, place_replicas
from pdserve.protocol.errors import InvalidConfigError
from pdserve.redis_process import RedisStartError, start_redis, without_password
from pdserve.supervisor import Slot, StopRequested, Supervisor, UpError

LOOPBACK = "127.0.0.1"
_PDSERVE = (sys.executable, "-m", "pdserve")
_PROBE_TIMEOUT_S = 1.0
_REDIS_START_TIMEOUT_S = 10.0
PROBER = "up"  # the name of up's own certificate, which its health probes of replicas present
CERTIFICATE_DAYS = 3650  # longer than any run: its files go with it, and no one keeps the CA's key


@dataclass(frozen=True, slots=True)
class UpConfig:
    model: str | None  # what --model names (checkpoints.model_ref); None: the default model
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
    api_keys: tuple[str, ...] = ()  # the gateway's, beside any in $PDSERVE_API_KEY
    enable_prefix_caching: bool = True
    lend_idle_cpus: bool = True  # on CPU: prefill replica i lends its CPUs to decode replica i while idle
    quantized_weights: str = "dequantized"  # the replicas' (engine.weights)
    quantization: str | None = None  # the replicas' (engine.quantize_at_load): None, "int8", "int4" or "w8a8"
    kv_cache_dtype: str = "auto"  # the replicas' KV pools: "auto" (their dtype) or "int8"
    enforce_eager: bool = False  # the replicas' (engine.cpu_decode_plan)
    routing: str = "cache-aware"  # the gateway's (cluster.routing_policies)
    migration_limit: int = 3  # the gateway's
    prefill_placement: str = "auto"  # the gateway's (gateway.disaggregated.prefill_placement)
    line_order: str = "slo"  # the gateway's (gateway.disaggregated.prefill_line)
    tool_call_parser: str = DEFAULT_TOOL_CALL_PARSER  # the gateway's (gateway.front.tool_parsers)
    max_step_ms: float = DEFAULT_MAX_STEP_MS  # the decode replicas' (engine.step_budget)
    gpu_memory_utilization: float = 0.9  # of each GPU, split between the replicas placed on it
    kv_cache_memory_bytes: int | None = None  # each replica's KV pool; None: see sized_kv_pools
    internal_tls: bool = True  # mutual TLS between the children, with certificates made for the run
    # On plain "cuda": the GPU of each replica (gpu_placement); None before placement.
    prefill_gpus: tuple[int, ...] | None = None
    decode_gpus: tuple[int, ...] | None = None


def run_up(config: UpConfig, out: TextIO, log: TextIO) -> int:
    """Starts everything, prints the endpoints to `out`, serves until a stop signal; exit status."""
    stop = threading.Event()
    previous_handlers = {signum: signal.signal(signum, lambda *_: stop.set())
                         for signum in (signal.SIGINT, signal.SIGTERM)}
    run_dir = Path(tempfile.mkdtemp(prefix="pdserve-up-"))  # its owner's alone
    up_log = UpLog(log)
    supervisor = Supervisor(up_log, config.startup_timeout_s)
    own_logs = logging.getLogger("pdserve")  # this process's (fetching the model, say), as up's lines
    own_logs.addHandler(log_handler := UpLogHandler(up_log))
    own_logs.propagate = False
    try:
        config = placed_on_gpus(config, _cuda_device_count() if config.device == "cuda" else 0)
        config = sized_kv_pools(config, read_host_memory)
        _check_port_free(config.host, config.grpc_port, "--grpc-port")
        _check_port_free(config.host, config.http_port, "--http-port")
        model = resolve_model(config.model, os.environ)  # once: the children get its folder
        if config.redis_url is not None:
            redis_url, redis_shown = config.redis_url, without_password(config.redis_url)
        else:
            supervisor.redis = redis = start_redis(data_dir=run_dir / "redis", timeout_s=_REDIS_START_TIMEOUT_S,
                                                   password=secrets.token_hex(16))
            redis_url = redis.url
            # For whoever started `up`, to inspect the deployment with: the password in a file, not on screen.
            url_file = _write_private(run_dir / "redis-url", redis_url)
            redis_shown = f"{without_password(redis_url)}  ({redis.server}; the URL with its password: {url_file})"
        tls = internal_certificates(run_dir / "tls", config) if config.internal_tls else None
        leases = [create_lease(run_dir / f"cores-{i}") for i in range(num_core_leases(config))]
        for slot in child_slots(config, model, redis_url, secrets.token_hex(32), tls, leases):
            supervisor.start(slot)
        supervisor.wait_ready(time.monotonic() + config.startup_timeout_s, stop)
        model_id = served_model_id(gateway_target(config), _PROBE_TIMEOUT_S, _probe_key(config))
        out.write(endpoints_text(config, model.model_dir, model_id, redis_shown))
        out.flush()
        supervisor.supervise(stop)
        return 0
    except StopRequested:
        return 0
    except (UpError, PlacementError, InvalidConfigError, RedisStartError, grpc.RpcError) as error:
        log.write(f"pdserve up: {error}\n")
        return 1
    except CheckpointError as error:
        log.write(f"pdserve up: {error}\n")
        return 2
    finally:
        log.write("pdserve up: stopping\n")
        supervisor.stop(config.shutdown_timeout_s)
        shutil.rmtree(run_dir, ignore_errors=True)
        own_logs.removeHandler(log_handler)
        own_logs.propagate = True
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)


def placed_on_gpus(config: UpConfig, num_gpus: int) -> UpConfig:
    """`config` with a GPU for every replica when they run on plain "cuda" (see gpu_placement);
    GPU lists are refused on any other device."""
    if config.device != "cuda":
        if config.prefill_gpus is not None or config.decode_gpus is not None:
            raise PlacementError(f"--prefill-gpus and --decode-gpus need --device cuda, not {config.device}")
        return config
    prefill_gpus, decode_gpus = place_replicas(
        config.num_prefill, config.num_decode, num_gpus, config.prefill_gpus, config.decode_gpus)
    return dataclasses.replace(config, prefill_gpus=tuple(prefill_gpus), decode_gpus=tuple(decode_gpus))


def sized_kv_pools(config: UpConfig, read_host: Callable[[], HostMemory]) -> UpConfig:
    """`config` with a KV pool size for every replica on a CPU, which share the host's memory: the
    size given, or an even part of the host's default share (cpu_kv_memory), read once here so that
    replicas loading side by side do not count each other's memory, and held to /dev/shm's room
    where the decode replicas' pools live. On CUDA each replica sizes its own from its GPU."""
    if config.device != "cpu" or config.kv_cache_memory_bytes is not None:
        return config
    num_bytes = kv_memory_bytes(read_host(), config.num_prefill + config.num_decode, in_shared_memory=True)
    return dataclasses.replace(config, kv_cache_memory_bytes=num_bytes)


def served_model_id(target: str, timeout_s: float, api_key: str | None = None) -> str:
    """The id the gateway serves its model under (what OpenAI requests name as "model")."""
    from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
    with grpc.insecure_channel(target) as channel:
        response = gateway_pb2_grpc.GatewayStub(channel).ListModels(
            gateway_pb2.ListModelsRequest(), timeout=timeout_s, metadata=metadata)
    if not response.models:
        raise UpError(f"the gateway at {target} lists no model")
    return response.models[0].id


def gateway_target(config: UpConfig) -> str:
    return f"{_reachable(config.host)}:{config.grpc_port}"


def internal_certificates(directory: Path, config: UpConfig) -> dict[str, InternalTlsFiles]:
    """A new CA's certificate for each child and for up's probes (PROBER), all for loopback, in
    `directory`, which only its owner may enter; each one's files by name."""
    names = [PROBER, *(name for _, name in replica_names(config)), "gateway"]
    return write_certificates(directory, names, (LOOPBACK, "localhost"), CERTIFICATE_DAYS)


def replica_names(config: UpConfig) -> list[tuple[str, str]]:
    """(kind, name) of each replica, prefill then decode; the name is also its replica id."""
    return [(kind, f"{kind}-{index}") for kind, count in (("prefill", config.num_prefill),
                                                         ("decode", config.num_decode)) for index in range(count)]


def num_core_leases(config: UpConfig) -> int:
    """How many prefill/decode pairs share a core lease: prefill replica i lends to decode replica
    i, on CPU, where each replica has CPUs of its own."""
    lending = config.device == "cpu" and config.lend_idle_cpus
    num_replicas = config.num_prefill + config.num_decode
    return min(config.num_prefill, config.num_decode) if lending and len(os.sched_getaffinity(0)) >= num_replicas else 0


def child_slots(config: UpConfig, model: ResolvedModel, redis_url: str, internal_secret: str,
                tls: dict[str, InternalTlsFiles] | None = None, leases: list[Path] = ()) -> list[Slot]:
    """Prefill replicas, decode replicas, then the gateway: `python -m pdserve <service> ...` on
    the model's resolved folder, the Redis URL, the deployment secret and, with `tls`, the child's
    own certificate files in their environment. On CPU each replica gets its own CPUs (see
    cpu_placement), and the pairs `leases` names lend and borrow them (engine/core_lease.py); on
    GPUs the one placement gave it, kept across its restarts, and each the KV
    pool size `config` holds (sized_kv_pools)."""
    common = ("--model", str(model.model_dir))
    inherited = {name: value for name, value in os.environ.items() if name not in TLS_ENV_VARS}
    env = {**inherited, REDIS_URL_ENV: redis_url, SECRET_ENV: internal_secret}

    def env_of(name: str) -> dict[str, str]:
        return env if tls is None else {**env, **tls[name].env()}

    probe_tls = None if tls is None else tls[PROBER].load()
    replicas = replica_names(config)
    gpus = ([*config.prefill_gpus, *config.decode_gpus]
            if config.prefill_gpus is not None and config.decode_gpus is not None else None)
    devices = [f"cuda:{gpu}" for gpu in gpus] if gpus else [config.device] * len(replicas)
    # Replicas that share a GPU share its memory: each sizes its KV pool from its part.
    utilizations = ([config.gpu_memory_utilization / gpus.count(gpu) for gpu in gpus] if gpus
                    else [config.gpu_memory_utilization] * len(replicas))
    cpu_sets = split_cpus(sorted(os.sched_getaffinity(0)), len(replicas)) if config.device == "cpu" else None
    pool = () if config.kv_cache_memory_bytes is None else ("--kv-cache-memory", str(config.kv_cache_memory_bytes))
    quantization = () if config.quantization is None else ("--quantization", config.quantization)
    slots = []
    for i, (kind, name) in enumerate(replicas):
        pinning = ("--cpus", cpu_list_arg(cpu_sets[i])) if cpu_sets else ()
        lending = _lease_args(kind, i - (config.num_prefill if kind == "decode" else 0), leases, cpu_sets)
        step = ("--max-step-ms", f"{config.max_step_ms:g}") if kind == "decode" else ()
        caching = "--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching"
        eager = ("--enforce-eager",) if config.enforce_eager else ()
        argv = (*_PDSERVE, kind, *common, "--replica-id", name, "--device", devices[i], "--dtype", config.dtype,
                "--quantized-weights", config.quantized_weights, *quantization, "--kv-cache-dtype", config.kv_cache_dtype,
                "--gpu-memory-utilization", f"{utilizations[i]:.4g}", caching, *eager, *pinning, *lending, *pool, *step)
        slots.append(Slot(name, functools.partial(replica_spec, name, argv, env_of(name), probe_tls,
                                                  (config.grpc_port, config.http_port))))
    gateway = ChildSpec(
        name="gateway",
        argv=(*_PDSERVE, "gateway", *common, "--served-model-name", model.served_name, "--host", config.host,
              "--grpc-port", str(config.grpc_port), "--http-port", str(config.http_port),
              "--transport", config.transport, "--routing", config.routing,
              "--migration-limit", str(config.migration_limit), "--prefill-placement", config.prefill_placement,
              "--line-order", config.line_order, "--tool-call-parser", config.tool_call_parser),
        grpc_target=gateway_target(config),
        http_health_url=f"http://{_reachable(config.host)}:{config.http_port}/health",
        env=gateway_env(env_of("gateway"), config.api_keys))
    slots.append(Slot("gateway", lambda: gateway, fatal_if_restart_fails=True))
    return slots


def _lease_args(kind: str, index: int, leases: list[Path], cpu_sets: list[list[int]] | None) -> tuple[str, ...]:
    """The core lease flags of replica `index` of `kind`: prefill i lends, decode i borrows its CPUs."""
    if index >= len(leases):
        return ()
    if kind == "prefill":
        return ("--core-lease", str(leases[index]))
    return ("--core-lease", str(leases[index]), "--borrow-cpus", cpu_list_arg(cpu_sets[index]))


def gateway_env(env: dict[str, str], api_keys: tuple[str, ...]) -> dict[str, str]:
    """`env` with `api_keys` added to the gateway's key variable, off the command line."""
    keys = [key for key in (env.get(API_KEY_ENV_VAR, ""), *api_keys) if key]
    return {**env, API_KEY_ENV_VAR: ",".join(keys)} if keys else env


def replica_spec(name: str, argv: tuple[str, ...], env: dict[str, str], probe_tls: InternalTls | None,
                 gateway_ports: tuple[int, int]) -> ChildSpec:
    """The replica's command on a free loopback port, taken now (each start gets a fresh one),
    never one of the gateway's ports, which it may not have bound yet."""
    port = free_port(LOOPBACK, reserved=gateway_ports)
    return ChildSpec(name, (*argv, "--host", LOOPBACK, "--port", str(port)), f"{LOOPBACK}:{port}",
                     grpc_tls=probe_tls, env=env)


def endpoints_text(config: UpConfig, model_dir: Path, model_id: str, redis: str) -> str:
    grpc_target = gateway_target(config)
    http_base = f"http://{_reachable(config.host)}:{config.http_port}"
    body = json.dumps({"model": model_id, "prompt": "hello", "max_tokens": 16})
    return (
        f"pdserve is up: gRPC {grpc_target}, HTTP {http_base}/v1\n"
        f"  gateway gRPC     {grpc_target}  (pdserve.v1.Gateway)\n"
        f"  OpenAI HTTP      {http_base}/v1\n"
        f"  Redis            {redis}\n"
        f"  model            {model_id}  ({model_dir})\n"
        f"  replicas         {config.num_prefill} prefill, {config.num_decode} decode "
        f"on {_devices_text(config)}, transport {config.transport}\n"
        f"Try:\n"
        f"  pdserve generate \"hello\" --gateway {grpc_target}\n"
        f"  curl -s {http_base}/v1/completions -H 'Content-Type: application/json' -d '{body}'\n"
        f"Ctrl-C stops everything.\n")


def _devices_text(config: UpConfig) -> str:
    if config.prefill_gpus is None or config.decode_gpus is None:
        return config.device
    return (f"cuda (prefill on GPUs {','.join(map(str, config.prefill_gpus))}, "
            f"decode on GPUs {','.join(map(str, config.decode_gpus))})")


def _write_private(path: Path, text: str) -> Path:
    """Writes `text` to a new file at `path` that only its owner may read."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(text + "\n")
    return path


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _probe_key(config: UpConfig) -> str | None:
    """A key the gateway takes, for up's own call to it."""
    keys = [*config.api_keys, *os.environ.get(API_KEY_ENV_VAR, "").split(",")]
    return next((key.strip() for key in keys if key.strip()), None)


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
