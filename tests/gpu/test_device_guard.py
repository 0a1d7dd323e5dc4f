"""The device guard and the kernel warm-up on real GPUs: an engine on GPU K launches everything
there, and compiles nothing once it has started.

A float32 tiny-model engine on `cuda:K` (the thread building it binds that device and warms its
kernels up) is driven from `AsyncEngine`'s engine thread, a thread CUDA starts on device 0. At
every step that thread's current device is K, no memory lands on another GPU, Triton compiles
no kernel while the prompts (contexts of 1 to 20 blocks) run, and greedy tokens equal the same
engine's on the CPU. Only K > 0 tells the guard apart from CUDA's default; K = 0 checks the rest.
"""
import asyncio
import dataclasses

import pytest
import torch

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.sampling_params import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

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


@pytest.mark.parametrize("gpu", ["first", "last"])
def test_an_engine_on_one_gpu_steps_there_and_compiles_nothing_after_warm_up(gpu, tiny_model):
    from triton import knobs

    num_gpus = torch.cuda.device_count()
    if gpu == "last" and num_gpus < 2:
        pytest.skip("the device guard needs a second GPU")
    index = 0 if gpu == "first" else num_gpus - 1
    config = EngineConfig(model=tiny_model(dtype="float32"), dtype="float32", num_gpu_blocks=64)
    expected, _ = greedy(LLMEngine(config))
    engine = LLMEngine(dataclasses.replace(config, device=f"cuda:{index}"))
    compiles: list[str] = []
    knobs.runtime.jit_cache_hook = lambda *args, **kwargs: compiles.append(str(kwargs.get("repr"))) and False
    try:
        got, devices_at_steps = greedy(engine)
    finally:
        knobs.runtime.jit_cache_hook = None
    assert devices_at_steps == {index}
    assert not any(torch.cuda.memory_allocated(other) for other in range(num_gpus) if other != index)
    assert not compiles, compiles
    assert got == expected
