"""`pdserve prefill`: one prefill replica (the Prefill service on a gRPC server)."""
from __future__ import annotations

import argparse
import asyncio

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.replica_server import serve_replica
from pdserve.cluster.service_args import add_replica_arguments, run_service, served_model_name
from pdserve.engine.core_lease import Lender
from pdserve.engine.engine_args import add_engine_arguments, bind_cpus, engine_config_from, model_text
from pdserve.prefill_svc.replica import PrefillReplica, PrefillReplicaConfig
from pdserve.prefill_svc.service import PrefillService
from pdserve.v1 import prefill_pb2, prefill_pb2_grpc

SERVICE_NAMES = [prefill_pb2.DESCRIPTOR.services_by_name["Prefill"].full_name]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_replica_arguments(parser, "prefill")
    add_engine_arguments(parser)
    parser.add_argument("--core-lease", metavar="PATH",
                        help="a core lease file (engine/core_lease.py, made by `pdserve up`) through which this "
                             "replica lends its --cpus to the decode replica beside it while it has no work")


def run(args: argparse.Namespace) -> int:
    bind_cpus(args.cpus)  # before any thread starts
    return run_service(args, "prefill", serve)


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()

    def build(replica_id: str, endpoint: str, auth: InternalAuth) -> PrefillReplica:
        replica = PrefillReplica(PrefillReplicaConfig(
            engine=engine_config_from(args, detokenize=False), replica_id=replica_id, auth=auth,
            max_waiting_requests=args.max_waiting_requests), loop)
        if args.core_lease is not None:
            replica.engine.cores = Lender(args.core_lease)
        return replica

    def add_servicers(replica: PrefillReplica, server) -> None:
        prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillService(replica), server)

    await serve_replica(args, "prefill", SERVICE_NAMES, build, add_servicers,
                        model_text(args, served_model_name(args)))
