"""How a prefill or decode replica runs: bind, build, serve, register, report load, stop.

    bind the gRPC port → build the replica (loads the model) → add its servicers → start
    → heartbeat into the registry → SERVING → ... SIGTERM → NOT_SERVING, drain, deregister, stop
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import grpc

from cluster.grpc_server import GrpcServer
from cluster.registry import LOAD_FIELDS, ReplicaHeartbeat, default_host_id
from cluster.service_args import replica_id_from

logger = logging.getLogger(__name__)
LOAD_REPORT_INTERVAL_S = 0.5


class Replica(Protocol):
    def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def load(self) -> dict[str, int]: ...


async def serve_replica(
    args: argparse.Namespace,
    kind: str,
    service_names: list[str],
    build: Callable[[str, str], Replica],  # (replica_id, endpoint) -> replica
    add_servicers: Callable[[Replica, grpc.aio.Server], None],
) -> None:
    replica_id = replica_id_from(args, kind)
    server = GrpcServer(f"{args.host}:{args.port}", service_names)
    endpoint = f"{args.advertise_host or args.host}:{server.port}"
    replica = build(replica_id, endpoint)
    add_servicers(replica, server.server)
    await server.start()
    replica.start()
    heartbeat = ReplicaHeartbeat(args.redis_url, kind, replica_id, endpoint, default_host_id(), args.device)
    # Registered with its load: a replica listed with none would look full to the router.
    heartbeat.update_load(**_load_fields(await replica.load()))
    await heartbeat.start()
    reporter = asyncio.create_task(_report_load(heartbeat, replica.load))
    await server.mark_serving()
    logger.info("%s replica %s serving on %s", kind, replica_id, endpoint)

    async def shutdown() -> None:
        reporter.cancel()
        await heartbeat.stop()
        await replica.stop()

    await server.serve_until_signal(on_stop=shutdown)


async def _report_load(heartbeat: ReplicaHeartbeat, load: Callable[[], Awaitable[dict[str, int]]]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            heartbeat.update_load(**_load_fields(await load()))
            await asyncio.sleep(LOAD_REPORT_INTERVAL_S)


def _load_fields(figures: dict[str, int]) -> dict[str, int]:
    return {name: value for name, value in figures.items() if name in LOAD_FIELDS}
