"""`pdserve decode`: one decode replica (Decode + KVTransfer services on one gRPC server)."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.replica_server import serve_replica
from pdserve.cluster.service_args import add_replica_arguments, run_service, served_model_name
from pdserve.decode_svc.replica import DecodeReplica, DecodeReplicaConfig
from pdserve.decode_svc.service import DecodeService
from pdserve.engine.core_lease import Borrower
from pdserve.engine.engine_args import add_engine_arguments, bind_cpus, engine_config_from, model_text, parse_cpu_list
from pdserve.engine.step_budget import DEFAULT_MAX_STEP_MS
from pdserve.kvtransfer.receiver import KVReceiver
from pdserve.v1 import decode_pb2, decode_pb2_grpc, kv_transfer_pb2

SERVICE_NAMES = [
    decode_pb2.DESCRIPTOR.services_by_name["Decode"].full_name,
    kv_transfer_pb2.DESCRIPTOR.services_by_name["KVTransfer"].full_name,
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_replica_arguments(parser, "decode")
    add_engine_arguments(parser)
    parser.add_argument("--reservation-timeout-s", type=float, default=30.0,
                        help="release reserved KV blocks that receive no KV (or no generate command) in time")
    parser.add_argument("--max-step-ms", type=float, default=DEFAULT_MAX_STEP_MS,
                        help="prompts prefilled here (a gateway's choice) go in chunks sized so that an engine "
                             f"step lasts at most this, keeping the running streams' inter-token latency "
                             f"(default {DEFAULT_MAX_STEP_MS:g})")
    parser.add_argument("--max-reserved-fraction-per-caller", type=_fraction, default=0.5,
                        help="share of the KV pool one caller (gateway) may hold in reservations not yet joined")
    parser.add_argument("--core-lease", metavar="PATH",
                        help="a core lease file (engine/core_lease.py, made by `pdserve up`) through which the "
                             "prefill replica beside this one lends its CPUs (--borrow-cpus) while it has no work")
    parser.add_argument("--borrow-cpus", type=parse_cpu_list, default=None, metavar="LIST",
                        help="with --core-lease: the lending replica's CPUs, which this one's steps use with its "
                             "own --cpus while that replica is idle")


def run(args: argparse.Namespace) -> int:
    if (args.core_lease is None) != (args.borrow_cpus is None) or (args.core_lease is not None and not args.cpus):
        print("pdserve decode: --core-lease and --borrow-cpus go together, with --cpus", file=sys.stderr)
        return 2
    bind_cpus(args.cpus)  # before any thread starts
    return run_service(args, "decode", serve)


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()

    def build(replica_id: str, endpoint: str, auth: InternalAuth) -> DecodeReplica:
        replica = DecodeReplica(DecodeReplicaConfig(
            engine=dataclasses.replace(engine_config_from(args, detokenize=False), max_step_ms=args.max_step_ms),
            replica_id=replica_id, kv_endpoint=endpoint,
            reservation_timeout_s=args.reservation_timeout_s,
            max_reserved_fraction_per_caller=args.max_reserved_fraction_per_caller,
            max_waiting_requests=args.max_waiting_requests), loop)
        if args.core_lease is not None:
            replica.engine.cores = Borrower(args.core_lease, args.cpus, args.borrow_cpus)
        return replica

    def add_servicers(replica: DecodeReplica, server) -> None:
        decode_pb2_grpc.add_DecodeServicer_to_server(DecodeService(replica), server)
        KVReceiver(replica.pool, replica.layout, replica).add_to_server(server)

    await serve_replica(args, "decode", SERVICE_NAMES, build, add_servicers,
                        model_text(args, served_model_name(args)))


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value
