"""`pdserve prefill`: one prefill replica (the Prefill service on a gRPC server)."""
from __future__ import annotations

import argparse
import asyncio
import logging

from decode_svc.main import report_load
from gateway.registry import LOAD_FIELDS, ReplicaHeartbeat, default_host_id
from pdserve.serving import GrpcServer
from pdserve.service_args import add_replica_arguments, configure_logging, engine_config_from, replica_id_from
from pdserve.v1 import prefill_pb2, prefill_pb2_grpc
from prefill_svc.replica import PrefillReplica, PrefillReplicaConfig
from prefill_svc.service import PrefillService

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_replica_arguments(parser, "prefill")


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "prefill")
    asyncio.run(serve(args))
    return 0


async def serve(args: argparse.Namespace) -> None:
    replica_id = replica_id_from(args, "prefill")
    server = GrpcServer(f"{args.host}:{args.port}", [prefill_pb2.DESCRIPTOR.services_by_name["Prefill"].full_name])
    endpoint = f"{args.advertise_host or args.host}:{server.port}"
    replica = PrefillReplica(PrefillReplicaConfig(
        engine=engine_config_from(args, detokenize=False), replica_id=replica_id), asyncio.get_running_loop())
    prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillService(replica), server.server)
    await server.start()
    replica.start()
    heartbeat = ReplicaHeartbeat(args.redis_url, "prefill", replica_id, endpoint, default_host_id(), args.device)
    await heartbeat.start()
    reporter = asyncio.create_task(report_load(heartbeat, replica.load))
    await server.mark_serving()
    logger.info("prefill replica %s serving on %s", replica_id, endpoint)

    async def shutdown() -> None:
        reporter.cancel()
        await heartbeat.stop()
        await replica.stop()

    await server.serve_until_signal(on_stop=shutdown)
