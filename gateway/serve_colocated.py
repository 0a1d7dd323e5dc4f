"""`pdserve serve`: one process, one engine, the OpenAI-compatible HTTP API (like `vllm serve`)."""
from __future__ import annotations

import argparse
import asyncio
import logging

from pdserve.cluster.service_args import (
    add_engine_arguments,
    add_served_model_name_argument,
    bind_cpus,
    configure_logging,
    engine_config_from,
    served_model_name,
    with_resolved_model,
)
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.llm_engine import LLMEngine
from pdserve.gateway.admission import Admission
from pdserve.gateway.colocated import ColocatedFrontend
from pdserve.gateway.front_config import add_front_arguments, front_config_from
from pdserve.gateway.http_api import create_app
from pdserve.gateway.http_server import serving_http, wait_for_stop_signal
from pdserve.gateway.metrics import GatewayMetrics
from pdserve.gateway.tokenization import PromptBuilder

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_served_model_name_argument(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    add_front_arguments(parser)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "serve")
    bind_cpus(args.cpus)
    asyncio.run(serve(with_resolved_model(args)))
    return 0


def publish_load(metrics: GatewayMetrics, load: dict[str, int]) -> None:
    metrics.set_num_requests_waiting(load["waiting_seqs"])
    metrics.on_prefix_cache_counts(("engine", ""), load["prefix_cache_queries"], load["prefix_cache_hits"])


async def serve(args: argparse.Namespace) -> None:
    front = front_config_from(args)
    engine = LLMEngine(engine_config_from(args, detokenize=True))
    async_engine = AsyncEngine(engine, asyncio.get_running_loop())
    model_name = served_model_name(args)
    metrics = GatewayMetrics(model_name)
    prompts = PromptBuilder(engine.tokenizer, args.model, engine.model_config.vocab_size, engine.max_model_len)
    frontend = ColocatedFrontend(async_engine, prompts, metrics, model_name)
    async_engine.on_step = lambda engine: publish_load(metrics, engine.load())
    async_engine.start()
    app = create_app(frontend, metrics, api_keys=front.api_keys,
                     admission=Admission(front.max_pending_requests, metrics.registry, model_name))
    async with serving_http(app, args.host, args.port, front.tls.ssl_context() if front.tls else None):
        logger.info("serving %s on %s://%s:%d/v1 (%d KV blocks, %s)", model_name, "https" if front.tls else "http",
                    args.host, args.port, engine.allocator.num_blocks,
                    "API keys required" if front.api_keys.required else "no API key required")
        await wait_for_stop_signal()
    await async_engine.stop()
