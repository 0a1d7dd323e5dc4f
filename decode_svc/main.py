"""`pdserve decode`: one decode replica (Decode + KVTransfer services on one gRPC server)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from decode_svc.replica import DecodeReplica, DecodeReplicaConfig
from decode_svc.service import DecodeService
from gateway.registry import LOAD_FIELDS, ReplicaHeartbeat, default_host_id
from kvtransfer.receiver import KVReceiver
from pdserve.serving import GrpcServer
from pdserve.service_args import add_replica_arguments, configure_logging, engine_config_from, replica_id_from
from pdserve.v1 import decode_pb2, decode_pb2_grpc, kv_transfer_pb2, kv_transfer_pb2_grpc

logger = logging.getLogger(__name__)
LOAD_REPORT_INTERVAL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_replica_arguments(parser, "decode")
    parser.add_argument("--reservation-timeout-s", type=float, default=30.0,
                        help="release reserved KV blocks that receive no KV (or no Generate) in time")


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "decode")
    asyncio.run(serve(args))
    return 0


async def serve(args: argparse.Namespace) -> None:
    replica_id = replica_id_from(args, "decode")
    server = GrpcServer(f"{args.host}:{args.port}", [
        decode_pb2.DESCRIPTOR.services_by_name["Decode"].full_name,
        kv_transfer_pb2.DESCRIPTOR.services_by_name["KVTransfer"].full_name,
    ])
    endpoint = f"{args.advertise_host or args.host}:{server.port}"
    replica = DecodeReplica(DecodeReplicaConfig(
        engine=engine_config_from(args, detokenize=False), replica_id=replica_id, kv_endpoint=endpoint,
        reservation_timeout_s=args.reservation_timeout_s), asyncio.get_running_loop())
    decode_pb2_grpc.add_DecodeServicer_to_server(DecodeService(replica), server.server)
    kv_transfer_pb2_grpc.add_KVTransferServicer_to_server(
        KVReceiver(replica.pool, replica.layout, replica), server.server)
    await server.start()
    replica.start()
    heartbeat = ReplicaHeartbeat(args.redis_url, "decode", replica_id, endpoint, default_host_id(), args.device)
    await heartbeat.start()
    reporter = asyncio.create_task(report_load(heartbeat, replica.load))
    await server.mark_serving()
    logger.info("decode replica %s serving on %s (%d KV blocks)", replica_id, endpoint, replica.num_blocks)

    async def shutdown() -> None:
        reporter.cancel()
        await heartbeat.stop()
        await replica.stop()

    await server.serve_until_signal(on_stop=shutdown)


async def report_load(heartbeat: ReplicaHeartbeat, load) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            heartbeat.update_load(**{name: value for name, value in (await load()).items() if name in LOAD_FIELDS})
            await asyncio.sleep(LOAD_REPORT_INTERVAL_S)
