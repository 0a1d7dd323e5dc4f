"""How a prefill or decode replica runs: bind, build, serve, register, report load, drain, stop.

    bind the gRPC port → build the replica (loads the model) → add its servicers → start
    → heartbeat into the registry → SERVING → ... SIGTERM → drain → stop

Starting logs one line as loading begins and one once SERVING (cluster/startup_log.py).

The server refuses callers without the deployment secret, and, with internal TLS, speaks only
mutual TLS (cluster/internal_tls.py); the heartbeat signs the replica's registry entry with the
secret (cluster/internal_auth.py, cluster/registry.py). The entry announces the replica's KV
layout fingerprint, by which gateways pair only compatible replicas.

Draining, in this order, so that no request is sent to a replica that refuses it:
1. Deregister: the heartbeat key goes, and gateways read the registry on every request they
   route, so new requests go elsewhere at once.
2. NOT_SERVING: health checks (orchestrators, `pdserve up`) see the replica leaving.
3. Wait, up to `--drain-timeout-s`, until nothing is in flight (`Replica.num_in_flight`). The
   server still takes calls meanwhile: a request routed just before the deregistration lands
   here and is counted. Idle has to hold for a moment before it counts (cluster/drain.py), so
   that such a late request, between its routing and its first call here, is not stranded.
4. Stop the replica (its idle sessions end, its engine stops), then the server.

A replica whose engine thread hangs (cluster/engine_watchdog.py) leaves the same way but
without waiting: deregister, NOT_SERVING, stop (its requests fail with UNAVAILABLE and move to
other replicas), then exit with an error for its supervisor to restart it.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

import grpc
from redis.exceptions import RedisError

from pdserve.cluster.drain import drain
from pdserve.cluster.engine_watchdog import watch_engine
from pdserve.cluster.gc_heap import freeze_startup_heap
from pdserve.cluster.grpc_server import GrpcServer
from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.prefix_digest import MAX_DIGEST_HASHES
from pdserve.cluster.registry import LOAD_FIELDS, ReplicaHeartbeat, default_host_id
from pdserve.cluster.service_args import internal_auth_from, replica_id_from
from pdserve.cluster.startup_log import log_loading, log_ready

logger = logging.getLogger(__name__)
LOAD_REPORT_INTERVAL_S = 0.5
STOP_GRACE_S = 2.0  # for the calls still open once drained: session streams ending


class KVLayoutView(Protocol):
    fingerprint: str  # kvtransfer.layout.KVLayout's: equal for replicas whose KV blocks are byte-compatible


class Replica(Protocol):
    layout: KVLayoutView  # announced in the registry, so gateways pair only compatible replicas

    def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def load(self) -> dict[str, int]: ...
    async def cached_prefix_hashes(self, limit: int) -> list[bytes]: ...
    def num_in_flight(self) -> int: ...
    def engine_came_round_s(self) -> float: ...


class EngineStalledError(RuntimeError):
    """The replica's engine thread stopped coming round its loop; the replica left."""


async def serve_replica(
    args: argparse.Namespace,
    kind: str,
    service_names: list[str],
    build: Callable[[str, str, InternalAuth], Replica],  # (replica_id, endpoint, auth) -> replica
    add_servicers: Callable[[Replica, grpc.aio.Server], None],
    model_text: str,  # how the startup lines name the engine (engine_args.model_text)
) -> None:
    replica_id = replica_id_from(args, kind)
    auth = internal_auth_from(args, kind)
    server = GrpcServer(f"{args.host}:{args.port}", service_names, auth)
    endpoint = f"{args.advertise_host or args.host}:{server.port}"
    started_s = time.monotonic()
    log_loading(model_text, args.device)
    replica = build(replica_id, endpoint, auth)
    add_servicers(replica, server.server)
    await server.start()
    replica.start()
    heartbeat = ReplicaHeartbeat(args.redis_url, kind, replica_id, endpoint, default_host_id(), args.device,
                                 signing_key=auth.secret, kv_layout_fingerprint=replica.layout.fingerprint)
    # Registered with its load: a replica listed with none would look full to the router.
    load = await replica.load()
    heartbeat.update_load(**_load_fields(load))
    await heartbeat.start()
    reporter = asyncio.create_task(_report_load(heartbeat, replica))
    freeze_startup_heap()
    await server.mark_serving()
    log_ready(model_text, time.monotonic() - started_s, load, f"{kind} replica {replica_id} serving on {endpoint}")

    signalled = asyncio.create_task(server.wait_for_signal())
    stalled = asyncio.create_task(watch_engine(replica.engine_came_round_s, args.engine_stall_s))
    await asyncio.wait((signalled, stalled), return_when=asyncio.FIRST_COMPLETED)
    stalled_s = stalled.result() if stalled.done() else None
    signalled.cancel()
    stalled.cancel()
    reporter.cancel()
    try:
        await heartbeat.stop()
    except RedisError as error:  # its key expires on its own
        logger.warning("could not deregister: %s", error)
    await server.mark_not_serving()
    if stalled_s is not None:
        logger.error("the engine has not come round its loop for %.0f s: deregistered; ending the requests "
                     "on this replica and exiting", stalled_s)
        await replica.stop()
        await server.stop(0)
        raise EngineStalledError(f"{kind} replica {replica_id}: engine stalled")
    logger.info("deregistered; draining %d in-flight requests (up to %.0f s)",
                replica.num_in_flight(), args.drain_timeout_s)
    started_s = time.monotonic()
    if await drain(replica.num_in_flight, args.drain_timeout_s):
        logger.info("drained in %.1f s", time.monotonic() - started_s)
    else:
        logger.warning("drain timed out with %d requests in flight; stopping them", replica.num_in_flight())
    await replica.stop()
    await server.stop(STOP_GRACE_S)


async def _report_load(heartbeat: ReplicaHeartbeat, replica: Replica) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            heartbeat.update_load(**_load_fields(await replica.load()))
            heartbeat.update_prefixes(await replica.cached_prefix_hashes(MAX_DIGEST_HASHES))
            await asyncio.sleep(LOAD_REPORT_INTERVAL_S)


def _load_fields(figures: dict[str, int]) -> dict[str, int]:
    return {name: value for name, value in figures.items() if name in LOAD_FIELDS}
