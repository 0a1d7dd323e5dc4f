"""The lines an engine-serving process (replica, `pdserve serve`) logs while it starts, one per stage:

    loading HuggingFaceTB/SmolLM2-135M-Instruct (bfloat16 on cpu)
    ready in 3.1 s: HuggingFaceTB/SmolLM2-135M-Instruct (bfloat16 on cpu), weights 0.12 GiB, KV pool
        2048 blocks x 16 = 32768 tokens (0.70 GiB), resident 0.48 GiB; ...

Fetching or converting the model comes before them, logged where it happens (checkpoints), and so
does the size of a CPU KV pool given none (engine/cpu_kv_memory.py). On
CUDA the engine warms its kernels up as it loads, which the loading line says. The lines name the
model by its served id, not its folder, and carry no secret; the engine describes it
(engine_args.model_text), so this module needs no engine.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def log_loading(model_text: str, device: str) -> None:
    """Logs the loading stage of the engine `model_text` ("<served id> (<dtype> on <device>)") names."""
    warm_up = ", then warming up its kernels" if device.startswith("cuda") else ""
    logger.info("loading %s%s", model_text, warm_up)


def log_ready(model_text: str, took_s: float, load: dict[str, int], serving: str) -> None:
    """Logs the ready stage: the model, its KV pool and the process's resident memory from the
    engine's `load` figures (a CPU pool's pages become resident as blocks are first written), and
    what now serves where (`serving`)."""
    num_blocks, block_size = load["total_blocks"], load["block_size"]
    logger.info("ready in %.1f s: %s, weights %.2f GiB, KV pool %d blocks x %d = %d tokens (%.2f GiB), "
                "resident %.2f GiB; %s", took_s, model_text, load["weights_bytes"] / 2**30, num_blocks, block_size,
                num_blocks * block_size, load["kv_pool_bytes"] / 2**30, load["resident_bytes"] / 2**30, serving)
