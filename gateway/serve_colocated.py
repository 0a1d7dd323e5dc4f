"""`pdserve serve`: one process, one engine, the OpenAI-compatible HTTP API (like `vllm serve`)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from aiohttp import web

from engine.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from gateway.colocated import ColocatedFrontend
from gateway.http_api import create_app
from gateway.metrics import GatewayMetrics
from gateway.tokenization import PromptBuilder
from pdserve.service_args import add_engine_arguments, configure_logging, engine_config_from

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--served-model-name", default=None, help="model id clients use (default: folder name)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")

def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "serve")
    asyncio.run(serve(args))
    return 0


async def serve(args: argparse.Namespace) -> None:
    engine = LLMEngine(engine_config_from(args, detokenize=True))
    async_engine = AsyncEngine(engine, asyncio.get_running_loop())
    model_name = args.served_model_name or args.model.rstrip("/").rsplit("/", 1)[-1]
    metrics = GatewayMetrics(model_name)
    prompts = PromptBuilder(engine.tokenizer, args.model, engine.model_config.vocab_size, engine.max_model_len)
    frontend = ColocatedFrontend(async_engine, prompts, metrics, model_name)
    async_engine.on_step = lambda engine: metrics.set_num_requests_waiting(engine.load()["waiting_seqs"])
    async_engine.start()
    runner = web.AppRunner(create_app(frontend, metrics), handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    logger.info("serving %s on http://%s:%d/v1 (%d KV blocks)", model_name, args.host, args.port,
                engine.allocator.num_blocks)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await async_engine.stop()
