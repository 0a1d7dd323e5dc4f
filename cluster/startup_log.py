"""The lines an engine-serving process (replica, `pdserve serve`) logs while it starts, one per stage:

    loading HuggingFaceTB/SmolLM2-135M-Instruct (float32 on cpu)
    ready in 3.1 s: HuggingFaceTB/SmolLM2-135M-Instruct (float32 on cpu), KV pool 2048 blocks x 16 = 32768 tokens; ...

Fetching or converting the model comes before them, logged where it happens (checkpoints). On
CUDA the engine warms its kernels up as it loads, which the loading line says. The lines name the
model by its served id, not its folder, and carry no secret.
"""
from __future__ import annotations

import argparse
import logging

from pdserve.cluster.service_args import served_model_name
from pdserve.engine.config import ModelConfig
from pdserve.engine.engine_config import resolve_dtype

logger = logging.getLogger(__name__)


def log_loading(args: argparse.Namespace) -> None:
    """Logs the loading stage of the engine `args` (resolved, see service_args) configure."""
    warm_up = ", then warming up its kernels" if args.device.startswith("cuda") else ""
    logger.info("loading %s%s", _model_text(args), warm_up)


def log_ready(args: argparse.Namespace, took_s: float, load: dict[str, int], serving: str) -> None:
    """Logs the ready stage: the model, its KV pool from the engine's `load` figures, and what
    now serves where (`serving`)."""
    num_blocks, block_size = load["total_blocks"], load["block_size"]
    logger.info("ready in %.1f s: %s, KV pool %d blocks x %d = %d tokens; %s", took_s, _model_text(args),
                num_blocks, block_size, num_blocks * block_size, serving)


def _model_text(args: argparse.Namespace) -> str:
    """"<served id> (<dtype> on <device>)", the dtype as the engine resolves `--dtype auto`."""
    dtype = resolve_dtype(args.dtype, ModelConfig.from_dir(args.model).torch_dtype, args.device)
    return f"{served_model_name(args)} ({dtype} on {args.device})"
