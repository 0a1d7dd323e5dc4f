"""`pdserve gateway`: the public gRPC (`pdserve.v1.Gateway`) and OpenAI-compatible HTTP fronts.

Both fronts share one configuration (gateway.front.front_config): the same API keys, the same TLS
certificate, and one admission bound over the requests of both.

On SIGTERM the gateway drains as a replica does: admission closes (every new request is refused
with UNAVAILABLE / HTTP 503, so clients and load balancers retry on another gateway), health turns
NOT_SERVING, the requests already taken stream to their end for up to `--drain-timeout-s`, then
both fronts stop.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from pdserve.cluster.drain import drain
from pdserve.cluster.gc_heap import freeze_startup_heap
from pdserve.cluster.grpc_server import GrpcServer
from pdserve.cluster.prefix_digest import PrefixDigests
from pdserve.cluster.redis_client import connect_redis
from pdserve.cluster.registry import LiveReplicas
from pdserve.cluster.routing_policies import ROUTING_POLICIES
from pdserve.cluster.service_args import (add_internal_auth_arguments, add_model_argument, add_redis_url_argument,
                                          add_served_model_name_argument, internal_auth_from, run_service,
                                          served_model_name)
from pdserve.gateway.disaggregated.dispatcher import DispatchConfig
from pdserve.gateway.disaggregated.frontend import DisaggregatedConfig, DisaggregatedFrontend
from pdserve.gateway.disaggregated.prefill_line import ORDERS
from pdserve.gateway.disaggregated.prefill_placement import PLACEMENTS
from pdserve.gateway.disaggregated.prefix_affinity import PrefixAffinity
from pdserve.gateway.disaggregated.replica_clients import Timeouts
from pdserve.gateway.disaggregated.request_store import RequestStore
from pdserve.gateway.front.admission import Admission
from pdserve.gateway.front.front_config import add_front_arguments, front_config_from
from pdserve.gateway.front.grpc_service import GatewayService
from pdserve.gateway.front.http_api import create_app
from pdserve.gateway.front.http_server import serving_http
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.gateway.front.tokenization import PromptBuilder
from pdserve.protocol.model_limits import ModelLimits
from pdserve.protocol.tokenizer import load_tokenizer
from pdserve.protocol.transport_choice import transport_from_name, TRANSPORT_NAMES
from pdserve.v1 import gateway_pb2

logger = logging.getLogger(__name__)
HEALTH_REFRESH_S = 1.0
STOP_GRACE_S = 2.0  # for the streams still open once drained
REDIS_TIMEOUT_S = 5.0
_TIMEOUTS = Timeouts()  # the defaults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)  # the gateway reads its tokenizer, chat template and config
    add_served_model_name_argument(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--grpc-port", type=int, default=50051)
    parser.add_argument("--http-port", type=int, default=8000)
    add_redis_url_argument(parser)
    parser.add_argument("--transport", choices=("auto", *TRANSPORT_NAMES), default="auto",
                        help="KV transport between prefill and decode (auto: from the replicas' host and device)")
    parser.add_argument("--migration-limit", type=int, default=3,
                        help="times a request may move to other replicas when one it runs on goes away (0: never)")
    parser.add_argument("--routing", choices=ROUTING_POLICIES, default="cache-aware",
                        help="cache-aware: weigh the prompt tokens a replica holds cached against its load; "
                             "load: load alone")
    parser.add_argument("--ttft-slo-s", type=float, default=2.0,
                        help="the time-to-first-token target: prompts wait in the gateway's line in this order "
                             "(--line-order) and a prefill replica is given at most half of it in queued work")
    parser.add_argument("--line-order", choices=ORDERS, default="slo",
                        help="slo: those that can still meet --ttft-slo-s first, earliest deadline first, the late "
                             "ones after; fifo: arrival order")
    parser.add_argument("--prefill-placement", choices=PLACEMENTS, default="auto",
                        help="auto: on a prefill replica, or on the decode replica itself when that is expected "
                             "to be sooner (a short prompt, a busy prefill side, a prefix it holds cached); "
                             "remote, local: always there")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0,
                        help="on SIGTERM, how long the requests already taken may stream before the gateway stops")
    parser.add_argument("--request-ttl-s", type=float, default=3600.0, help="how long finished requests stay in Redis")
    parser.add_argument("--rpc-timeout-s", type=float, default=_TIMEOUTS.rpc_s,
                        help="deadline of a reservation or an abort on a replica")
    parser.add_argument("--token-timeout-s", type=float, default=_TIMEOUTS.token_s,
                        help="a running request that gets no decode step in this long moves to another replica, "
                             "as when its replica goes away")
    parser.add_argument("--request-timeout-s", type=float, default=_TIMEOUTS.request_s,
                        help="deadline of a whole request on its replicas (its wait in the line, its prefill, all "
                             "its decode steps)")
    add_front_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    add_internal_auth_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return run_service(args, "gateway", serve)


async def serve(args: argparse.Namespace) -> None:
    front = front_config_from(args)
    limits = ModelLimits.from_dir(args.model)
    tokenizer = load_tokenizer(args.model)
    model_name = served_model_name(args)
    redis = connect_redis(args.redis_url, timeout_s=REDIS_TIMEOUT_S)
    internal_auth = internal_auth_from(args, "gateway")
    metrics = GatewayMetrics(model_name)
    prompts = PromptBuilder(tokenizer, args.model, limits.vocab_size, limits.max_model_len)
    frontend = DisaggregatedFrontend(
        DisaggregatedConfig(model_name=model_name, migration_limit=args.migration_limit, internal_auth=internal_auth,
                            timeouts=Timeouts(args.rpc_timeout_s, args.request_timeout_s, args.token_timeout_s),
                            dispatch=DispatchConfig(args.ttft_slo_s, args.line_order, args.prefill_placement,
                                                    transport_from_name(args.transport))),
        prompts, LiveReplicas(redis, internal_auth.secret), RequestStore(redis, ttl_s=args.request_ttl_s), metrics,
        PrefixAffinity(PrefixDigests(redis) if args.routing == "cache-aware" else None))

    admission = Admission(front.max_pending_requests, metrics.registry, model_name)
    server = GrpcServer(f"{args.host}:{args.grpc_port}", [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name],
                        credentials=front.tls.grpc_credentials() if front.tls else None,
                        max_message_bytes=front.max_request_bytes, max_pending_calls=front.max_pending_requests)
    GatewayService(frontend, frontend.store, front.api_keys, admission).add_to_server(server.server)
    app = create_app(frontend, metrics, max_body_bytes=front.max_request_bytes, api_keys=front.api_keys,
                     admission=admission, tool_call_parser=front.tool_call_parser)
    async with serving_http(app, args.host, args.http_port, front.tls.ssl_context() if front.tls else None):
        await server.start()
        health = asyncio.create_task(refresh_replicas(frontend))
        records = asyncio.create_task(frontend.keep_records_alive())
        freeze_startup_heap()
        await server.mark_serving()
        logger.info("gateway serving gRPC%s on %s:%d and HTTP on %s://%s:%d (model %s, %s)",
                    "+TLS" if front.tls else "", args.host, server.port, "https" if front.tls else "http",
                    args.host, args.http_port, model_name,
                    "API keys required" if front.api_keys.required else "no API key required")

        await server.wait_for_signal()
        admission.close()
        await server.mark_not_serving()
        logger.info("draining %d requests (up to %.0f s)", admission.num_pending, args.drain_timeout_s)
        if not await drain(lambda: admission.num_pending, args.drain_timeout_s):
            logger.warning("drain timed out with %d requests streaming; stopping them", admission.num_pending)
        health.cancel()
        records.cancel()
        await server.stop(STOP_GRACE_S)
    await frontend.close()
    await redis.aclose()


async def refresh_replicas(frontend: DisaggregatedFrontend) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            try:
                await frontend.refresh_replicas()
            except Exception as exc:  # Redis down: unhealthy until it answers again
                logger.warning("cannot list replicas: %s", exc)
            await asyncio.sleep(HEALTH_REFRESH_S)
