"""Command-line flags and set-up shared by the service commands (gateway, prefill, decode, serve).

Importing this module loads no torch: the gateway uses it too, and only the engine-running
commands pay for the engine's configuration, when they build it.
"""
from __future__ import annotations

import argparse
import logging
import os
import uuid
from typing import TYPE_CHECKING

from pdserve.checkpoints.model_ref import MODEL_HELP
from pdserve.cluster.internal_auth import InternalAuth, new_caller_id, warn_if_open
from pdserve.engine.engine_config import DTYPES
from pdserve.engine.errors import InvalidConfigError

if TYPE_CHECKING:
    from pdserve.engine.engine_config import EngineConfig

SECRET_ENV = "PDSERVE_INTERNAL_SECRET"
REDIS_URL_ENV = "PDSERVE_REDIS_URL"


def add_replica_arguments(parser: argparse.ArgumentParser, kind: str) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0: any free port)")
    parser.add_argument("--advertise-host", default=None,
                        help="host other processes use to reach this replica (default: --host)")
    add_redis_url_argument(parser)
    parser.add_argument("--replica-id", default=None, help=f"default: {kind}-<random>")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0,
                        help="on SIGTERM, how long in-flight requests may take to finish before the replica stops")
    add_internal_auth_arguments(parser)
    add_engine_arguments(parser)


def add_redis_url_argument(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get(REDIS_URL_ENV)
    parser.add_argument("--redis-url", default=default, required=default is None,
                        help=f"redis://[:password@]host:port/db (default: ${REDIS_URL_ENV}, which keeps a "
                             "password off the command line)")


def add_internal_auth_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--internal-secret-file", default=None, metavar="PATH",
                        help=f"file holding the deployment secret that internal calls and registry entries carry "
                             f"(default: ${SECRET_ENV}; neither: internal services run open)")


def internal_auth_from(args: argparse.Namespace, kind: str) -> InternalAuth:
    """The deployment secret from --internal-secret-file, else $PDSERVE_INTERNAL_SECRET (never from
    argv, where any local user reads it), and a fresh caller id; warns once if there is none."""
    secret = None
    if args.internal_secret_file:
        try:
            secret = open(args.internal_secret_file, "rb").read().strip()
        except OSError as error:
            raise InvalidConfigError(f"--internal-secret-file: {error}") from error
        if not secret:
            raise InvalidConfigError(f"--internal-secret-file {args.internal_secret_file} is empty")
    elif os.environ.get(SECRET_ENV):
        secret = os.environ[SECRET_ENV].encode()
    auth = InternalAuth(secret, new_caller_id(kind))
    warn_if_open(auth, kind)
    return auth


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="MODEL", help=MODEL_HELP)


def with_resolved_model(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with --model resolved to a local Hugging Face folder (fetched or converted once, see
    checkpoints.model_ref) and --served-model-name defaulting to that model's id; raises
    CheckpointError for a model that cannot be served."""
    from pdserve.checkpoints.model_ref import resolve_model

    model = resolve_model(args.model, os.environ)
    served_name = getattr(args, "served_model_name", None) or model.served_name
    return argparse.Namespace(**{**vars(args), "model": str(model.model_dir), "served_model_name": served_name})


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="auto: the checkpoint's dtype (bfloat16 for a float32 checkpoint on a GPU)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--kv-cache-bytes", type=int, default=None)
    parser.add_argument("--num-gpu-blocks", type=int, default=None, help="KV pool size in blocks")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="on CUDA: the share of the GPU's memory this replica may take, weights, activations "
                             "and KV pool (sized by a profile run) together, unless --kv-cache-bytes or "
                             "--num-gpu-blocks is given (default 0.9)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse the KV of full blocks of prompts seen before")
    parser.add_argument("--cpus", type=parse_cpu_list, default=None, metavar="LIST",
                        help="pin to these CPUs (e.g. 0-3,6) and run as many torch threads")
    parser.add_argument("--log-level", default="INFO")


def parse_cpu_list(text: str) -> list[int]:
    cpus = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


def bind_cpus(cpus: list[int] | None) -> None:
    """Pins this process to `cpus` and sizes torch's thread pool to them; call before any thread
    starts, so that every later one (the engine's, gRPC's, OpenMP's) inherits the pinning."""
    if not cpus:
        return
    import torch

    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))


def add_served_model_name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--served-model-name", default=None,
                        help="model id clients use (default: the hub id, else the model folder's or .gguf file's name)")


def served_model_name(args: argparse.Namespace) -> str:
    """The model id clients name in requests: --served-model-name, else the --model folder's name
    (with_resolved_model fills in a hub id's or the default model's id first)."""
    return args.served_model_name or args.model.rstrip("/").rsplit("/", 1)[-1]


def engine_config_from(args: argparse.Namespace, detokenize: bool) -> EngineConfig:
    from pdserve.engine.engine_config import EngineConfig

    return EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks, kv_cache_bytes=args.kv_cache_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        detokenize=detokenize, enable_prefix_caching=args.enable_prefix_caching)


def replica_id_from(args: argparse.Namespace, kind: str) -> str:
    return args.replica_id or f"{kind}-{uuid.uuid4().hex[:8]}"


def configure_logging(level: str, name: str) -> None:
    """Logs at `level` and above to stderr, each line naming the service; replaces the command
    line's own set-up (pdserve.cli), which would otherwise keep --log-level from taking effect."""
    logging.basicConfig(level=level.upper(), format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
                        force=True)
