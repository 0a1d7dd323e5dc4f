"""The device guard and the kernel warm-up on real GPUs: an engine on GPU K launches everything
there, and compiles nothing once it has started.

Builds a float32 tiny-model engine on `cuda:K` (the thread building it binds that device, and
warms its kernels up) and drives it from `AsyncEngine`'s engine thread, a thread that CUDA
starts on device 0. Checks that the engine thread's current device is K at every step, that no
memory was allocated on any other GPU, that Triton compiled no kernel while the prompts
(contexts from 1 to 20 blocks) ran, and that greedy tokens equal the same engine's on the CPU.
Only K > 0 tells the device guard apart from CUDA's default; K = 0 checks the rest.

    python scripts/gpu_device_guard_check.py            # K = the last GPU
    python scripts/gpu_device_guard_check.py --gpu 0    # warm-up and greedy on a one-GPU machine
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch
from triton import knobs

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.checkpoints.tiny.model import write_tiny_model

PROMPTS = ([1, 2, 3, 4], [50, 60, 70], [7] * 40, list(range(9, 259)), list(range(100, 400)))
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def greedy(engine: LLMEngine) -> tuple[list[list[int]], set[int]]:
    """Each prompt's tokens, and every current device the engine thread had at a step."""
    devices_at_steps: set[int] = set()

    async def run() -> list[list[int]]:
        async_engine = AsyncEngine(engine, asyncio.get_running_loop())
        if engine.device.type == "cuda":
            async_engine.on_step = lambda _: devices_at_steps.add(torch.cuda.current_device())
        async_engine.start()
        streams = []
        for i, prompt in enumerate(PROMPTS):
            streams.append(async_engine.open_stream(str(i)))
            await async_engine.call(lambda e, i=i, prompt=prompt: e.add_request(str(i), prompt, PARAMS))
        outputs = []
        for stream in streams:
            while not (output := await asyncio.wait_for(stream.get(), 120)).finished:
                pass
            outputs.append(output.outputs[0].token_ids)
        await async_engine.stop()
        return outputs

    return asyncio.run(run()), devices_at_steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=None, help="K (default: the last GPU)")
    args = parser.parse_args()
    num_gpus = torch.cuda.device_count()
    last = num_gpus - 1 if args.gpu is None else args.gpu
    if not 0 <= last < num_gpus:
        print(f"no GPU {last}: this machine has {num_gpus}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(write_tiny_model(Path(tmp) / "tiny", dtype="float32"))
        config = EngineConfig(model=model_dir, dtype="float32", num_gpu_blocks=64)
        expected, _ = greedy(LLMEngine(config))
        gpu_engine = LLMEngine(dataclasses.replace(config, device=f"cuda:{last}"))
        compiles: list[str] = []
        knobs.runtime.jit_cache_hook = lambda *args, **kwargs: compiles.append(str(kwargs.get("repr"))) and False
        got, devices_at_steps = greedy(gpu_engine)
        knobs.runtime.jit_cache_hook = None
    elsewhere = {gpu: torch.cuda.memory_allocated(gpu) for gpu in range(num_gpus) if gpu != last}
    checks = {
        f"engine thread on cuda:{last} at every step": devices_at_steps == {last},
        "no memory allocated on another GPU": not any(elsewhere.values()),
        "greedy tokens equal the CPU engine's": got == expected,
        "no Triton compile after the warm-up": not compiles,
    }
    for name, passed in checks.items():
        print(f"{'ok  ' if passed else 'FAIL'} {name}")
    print(f"devices at steps {sorted(devices_at_steps)}; bytes on other GPUs {elsewhere}; "
          f"compiled after warm-up: {compiles}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
