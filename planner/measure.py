"""Engine step times on this device: prefill against batch tokens, decode against batch and context.

Measured on `LLMEngine` as a replica runs it (random prompts, greedy, no EOS, no prefix caching),
each point the median of `repeats` timed steps after a warm-up one: a prefill point one step over
`num_seqs` prompts of one length; a decode point one of `num_seqs` running requests of one
context length, set up as `pdserve bench decode-step` does (`start_decode_batch`). KV transfer is
a block copy between two pools, the copy the shared-memory transport makes.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from pdserve.bench.bandwidth import timed_s
from pdserve.bench.machine import machine_summary
from pdserve.bench.profile_decode_step import start_decode_batch
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.kvtransfer.in_place import copy_blocks
from pdserve.planner.profile import DecodeFit, DecodeSample, PrefillFit, PrefillSample, Profile
from pdserve.protocol.sampling_params import SamplingParams

BLOCK_SIZE = 16  # EngineConfig's default, which the replicas run with


@dataclass(frozen=True, slots=True)
class MeasureConfig:
    model_dir: Path
    device: str = "cpu"
    dtype: str = "auto"
    threads: int | None = 1  # torch threads on CPU; a pinned replica runs one per CPU it owns
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    prefill_prompt_lens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024, 2000)
    prefill_num_seqs: tuple[int, ...] = (1, 2, 4, 8)
    decode_num_seqs: tuple[int, ...] = (1, 4, 8, 16, 32, 64)
    decode_context_lens: tuple[int, ...] = (64, 256, 1024)
    transfer_num_tokens: int = 2048
    repeats: int = 5

    def decode_slack(self, num_seqs: int, context_len: int) -> int:
        """Output tokens a decode point's requests may take: a step each while the batch prefills,
        the warm-up and timed steps, one to spare."""
        return -(-num_seqs * context_len // self.max_num_batched_tokens) + self.repeats + 3


def measure_profile(config: MeasureConfig) -> Profile:
    if config.threads is not None and config.device == "cpu":
        torch.set_num_threads(config.threads)
    most_tokens = max(2 * config.max_num_batched_tokens, *(  # the largest point, a block of slack a request
        n * (length + config.decode_slack(n, length) + BLOCK_SIZE)
        for n in config.decode_num_seqs for length in config.decode_context_lens))
    engine = LLMEngine(EngineConfig(
        model=str(config.model_dir), device=config.device, dtype=config.dtype,
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        num_gpu_blocks=-(-most_tokens // BLOCK_SIZE), enable_prefix_caching=False, detokenize=False))
    fits = lambda n, length: length + config.decode_slack(n, length) <= engine.max_model_len  # noqa: E731
    prefill_points = [(n, length) for length in config.prefill_prompt_lens for n in config.prefill_num_seqs
                      if n * length <= config.max_num_batched_tokens and fits(1, length)]
    decode_points = [(n, length) for length in config.decode_context_lens for n in config.decode_num_seqs
                     if fits(n, length)]
    with tqdm(total=len(prefill_points) + len(decode_points), desc="profile", unit="point") as bar:
        prefill_samples, decode_samples = [], []
        for n, length in prefill_points:
            prefill_samples.append(PrefillSample(n, length, _prefill_step_s(engine, n, length, config.repeats)))
            bar.update(1)
        for n, length in decode_points:
            decode_samples.append(_decode_sample(engine, config, n, length))
            bar.update(1)
    spec = engine.kv_spec
    device_name = (torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda"
                   else machine_summary().get("Model name", "cpu"))
    return Profile(
        hardware={"device": config.device, "name": device_name, "threads": torch.get_num_threads(),
                  "torch": torch.__version__},
        model={"dir": str(config.model_dir), "dtype": str(engine.dtype).removeprefix("torch."),
               "num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
               "block_size": spec.block_size, "vocab_size": engine.model_config.vocab_size},
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        kv_bytes_per_token=spec.bytes_per_block // spec.block_size,
        transfer_gb_per_s=_transfer_gb_per_s(engine, config),
        prefill=PrefillFit.fit(prefill_samples), decode=DecodeFit.fit(decode_samples),
        prefill_samples=prefill_samples, decode_samples=decode_samples)


def _prefill_step_s(engine: LLMEngine, num_seqs: int, prompt_len: int, repeats: int) -> float:
    generator = torch.Generator().manual_seed(prompt_len)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    timings_s = []
    for repeat in range(repeats + 1):
        for i in range(num_seqs):
            prompt = torch.randint(0, engine.model_config.vocab_size, (prompt_len,), generator=generator).tolist()
            engine.add_request(f"prefill-{num_seqs}x{prompt_len}-{repeat}-{i}", prompt, params)
        timings_s.append(timed_s(engine.step, engine.device))
        while engine.has_unfinished_requests():
            engine.step()
    return statistics.median(timings_s[1:])


def _decode_sample(engine: LLMEngine, config: MeasureConfig, num_seqs: int, context_len: int) -> DecodeSample:
    """At the tokens the batch held when the timed steps began."""
    request_ids = start_decode_batch(engine, num_seqs, context_len, config.decode_slack(num_seqs, context_len),
                                     f"decode-{num_seqs}x{context_len}")
    running = engine.scheduler.running
    num_context_tokens = sum(request.num_tokens for request in running)
    timings_s = [timed_s(engine.step, engine.device) for _ in range(config.repeats + 1)]
    if len(running) != num_seqs:
        raise RuntimeError(f"decode point {num_seqs} x {context_len}: {len(running)} requests running, not all")
    for request_id in request_ids:
        engine.abort_request(request_id)
    return DecodeSample(num_seqs, num_context_tokens, statistics.median(timings_s[1:]))


def _transfer_gb_per_s(engine: LLMEngine, config: MeasureConfig) -> float:
    spec = engine.kv_spec
    num_blocks = -(-config.transfer_num_tokens // spec.block_size)
    src, dst = spec.allocate(num_blocks, engine.device), spec.allocate(2 * num_blocks, engine.device)
    dst_ids = random.Random(0).sample(range(2 * num_blocks), num_blocks)
    timings_s = [timed_s(lambda: copy_blocks(dst, dst_ids, src, list(range(num_blocks))), engine.device)
                 for _ in range(config.repeats + 1)]
    return num_blocks * spec.bytes_per_block / statistics.median(timings_s[1:]) / 1e9
