"""Command-line flags and set-up shared by the service commands (gateway, prefill, decode, serve):
where a service binds and registers, its Redis, its model, its internal credentials, its logging.
The engine's own flags are engine/engine_args.py; this package never imports the engine.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable

from pdserve.checkpoints.model_ref import MODEL_HELP
from pdserve.cluster.engine_watchdog import DEFAULT_STALL_S
from pdserve.cluster.internal_auth import InternalAuth, new_caller_id, warn_if_open
from pdserve.cluster.internal_tls import add_internal_tls_arguments, internal_tls_from
from pdserve.cluster.keepalive import add_keepalive_arguments, keepalive_from
from pdserve.cluster.waiting_bound import DEFAULT_MAX_WAITING_REQUESTS
from pdserve.protocol.errors import InvalidConfigError

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
    parser.add_argument("--engine-stall-s", type=float, default=DEFAULT_STALL_S,
                        help="a replica whose engine thread takes no step (and does not idle) for this long "
                             "leaves the registry, fails its requests over to other replicas and exits")
    parser.add_argument("--max-waiting-requests", type=_at_least_one, default=DEFAULT_MAX_WAITING_REQUESTS,
                        help="prompts waiting in the engine's queue; past it a prompt is refused with "
                             f"RESOURCE_EXHAUSTED, which a client sees as HTTP 429 (default {DEFAULT_MAX_WAITING_REQUESTS})")
    add_internal_auth_arguments(parser)
    add_model_argument(parser)
    parser.add_argument("--log-level", default="INFO")


def add_redis_url_argument(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get(REDIS_URL_ENV)
    parser.add_argument("--redis-url", default=default, required=default is None,
                        help=f"redis://[:password@]host:port/db (default: ${REDIS_URL_ENV}, which keeps a "
                             "password off the command line)")


def add_internal_auth_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--internal-secret-file", default=None, metavar="PATH",
                        help=f"file holding the deployment secret that internal calls and registry entries carry "
                             f"(default: ${SECRET_ENV}; neither: internal services run open)")
    add_internal_tls_arguments(parser)
    add_keepalive_arguments(parser)


def internal_auth_from(args: argparse.Namespace, kind: str) -> InternalAuth:
    """The deployment secret from --internal-secret-file, else $PDSERVE_INTERNAL_SECRET (never from
    argv, where any local user reads it), the internal TLS files, checked, a fresh caller id and
    the keepalive flags; warns once for no secret, once for no TLS."""
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
    auth = InternalAuth(secret, new_caller_id(kind), keepalive_from(args), internal_tls_from(args))
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


def add_served_model_name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--served-model-name", default=None,
                        help="model id clients use (default: the hub id, else the model folder's or .gguf file's name)")


def served_model_name(args: argparse.Namespace) -> str:
    """The model id clients name in requests: --served-model-name, else the --model folder's name
    (with_resolved_model fills in a hub id's or the default model's id first)."""
    return args.served_model_name or args.model.rstrip("/").rsplit("/", 1)[-1]


def replica_id_from(args: argparse.Namespace, kind: str) -> str:
    return args.replica_id or f"{kind}-{uuid.uuid4().hex[:8]}"


def run_service(args: argparse.Namespace, name: str, serve: Callable[[argparse.Namespace], Awaitable[None]]) -> int:
    """A service command's body: logging named `name`, the model resolved, `serve(args)` until it
    returns. Exit status 0."""
    configure_logging(args.log_level, name)
    asyncio.run(serve(with_resolved_model(args)))
    return 0


def configure_logging(level: str, name: str) -> None:
    """Logs at `level` and above to stderr, each line naming the service; replaces the command
    line's own set-up (pdserve.cli), which would otherwise keep --log-level from taking effect."""
    logging.basicConfig(level=level.upper(), format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
                        force=True)


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
