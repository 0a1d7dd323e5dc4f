"""`pdserve serve`: one process, one engine, the OpenAI-compatible HTTP API (like `vllm serve`).

Starting logs a line as the engine starts loading and one once the API serves (cluster/startup_log.py).
"""
from __future__ import annotations

import argparse
import asyncio
import time

from pdserve.cluster.gc_heap import freeze_startup_heap
from pdserve.cluster.service_args import (add_model_argument, add_served_model_name_argument, run_service,
                                          served_model_name)
from pdserve.cluster.startup_log import log_loading, log_ready
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine_args import add_engine_arguments, bind_cpus, engine_config_from, model_text
from pdserve.engine.llm_engine import LLMEngine
from pdserve.gateway.colocated.frontend import ColocatedFrontend
from pdserve.gateway.front.admission import Admission
from pdserve.gateway.front.front_config import add_front_arguments, front_config_from
from pdserve.gateway.front.http_api import create_app
from pdserve.gateway.front.http_server import serving_http, wait_for_stop_signal
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.gateway.front.tokenization import PromptBuilder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    add_engine_arguments(parser)
    add_served_model_name_argument(parser)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    add_front_arguments(parser)


def run(args: argparse.Namespace) -> int:
    # Under load this engine's decode steps take 1.5-1.65x their time in process (bfloat16, AMD EPYC,
    # two threads: 27-28 ms at a mean batch of 6 against 16.6; `up`'s one-thread decode replica about
    # 1.1-1.3x). Tried and not kept: OpenMP's idle threads sleeping at once (OMP_WAIT_POLICY=PASSIVE),
    # 31-33 ms against 27-28 at 2.5 req/s, alternated twice.
    bind_cpus(args.cpus)  # before any thread starts
    return run_service(args, "serve", serve)


async def serve(args: argparse.Namespace) -> None:
    front = front_config_from(args)
    started_s = time.monotonic()
    model_name = served_model_name(args)
    engine_text = model_text(args, model_name)
    log_loading(engine_text, args.device)
    engine = LLMEngine(engine_config_from(args, detokenize=True))
    load = engine.load()  # read before its thread starts
    async_engine = AsyncEngine(engine, asyncio.get_running_loop())
    metrics = GatewayMetrics(model_name)
    prompts = PromptBuilder(engine.tokenizer, args.model, engine.model_config.vocab_size, engine.max_model_len)
    frontend = ColocatedFrontend(async_engine, prompts, metrics, model_name)
    async_engine.on_step = lambda engine: metrics.on_engine_load(engine.load())
    async_engine.start()
    app = create_app(frontend, metrics, max_body_bytes=front.max_request_bytes, api_keys=front.api_keys,
                     admission=Admission(front.max_pending_requests, metrics.registry, model_name),
                     tool_call_parser=front.tool_call_parser)
    freeze_startup_heap()
    async with serving_http(app, args.host, args.port, front.tls.ssl_context() if front.tls else None):
        log_ready(engine_text, time.monotonic() - started_s, load,
                  f"serving on {'https' if front.tls else 'http'}://{args.host}:{args.port}/v1 "
                  f"({'API keys required' if front.api_keys.required else 'no API key required'})")
        await wait_for_stop_signal()
    await async_engine.stop()
