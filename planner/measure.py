"""Engine step times on this device: prefill against batch tokens, decode against batch and context.

Measured on the engine itself (`LLMEngine`, one process, its own scheduler and model runner), as
a prefill or decode replica runs it: random prompt ids, greedy, no EOS, prefix caching off so
every prompt is computed in full. Each point is the median of `repeats` timed steps after one
untimed warm-up step. A prefill point is one step over `num_seqs` prompts of one length (all
inside the token budget); a decode point is a step of `num_seqs` running requests of one context
length, timed once every prompt is in, with every request still running (the first prompts in
decode while the last are prefilled, so each may take as many tokens as its context leaves), its
context the tokens the batch holds then. KV transfer is a block copy between two pools in this
process, the copy the shared-memory transport makes.
"""
from __future__ import annotations

import itertools
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.kvtransfer.in_place import copy_blocks
from pdserve.planner.profile import DecodeFit, DecodeSample, PrefillFit, PrefillSample, Profile

BLOCK_SIZE = 16  # EngineConfig's default, which the replicas run with
_REQUEST_NUMBERS = itertools.count()


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
    seed: int = 0


def measure_profile(config: MeasureConfig) -> Profile:
    if config.threads is not None and config.device == "cpu":
        torch.set_num_threads(config.threads)
    engine = LLMEngine(EngineConfig(
        model=str(config.model_dir), device=config.device, dtype=config.dtype,
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        num_gpu_blocks=_num_blocks(config),
        enable_prefix_caching=False, detokenize=False))
    rng = random.Random(config.seed)
    fits = lambda n, length: length + _decode_slack(config, n, length) <= engine.max_model_len  # noqa: E731
    prefill_points = [(n, length) for length in config.prefill_prompt_lens for n in config.prefill_num_seqs
                      if n * length <= config.max_num_batched_tokens and fits(1, length)]
    decode_points = [(n, length) for length in config.decode_context_lens for n in config.decode_num_seqs
                     if fits(n, length)]
    with tqdm(total=len(prefill_points) + len(decode_points), desc="profile", unit="point") as bar:
        prefill_samples = []
        for num_seqs, prompt_len in prefill_points:
            step_s = _prefill_step_s(engine, rng, num_seqs, prompt_len, config.repeats)
            prefill_samples.append(PrefillSample(num_seqs, prompt_len, step_s))
            bar.update(1)
        decode_samples = []
        for num_seqs, context_len in decode_points:
            step_s, num_context_tokens = _decode_step_s(
                engine, rng, num_seqs, context_len, config.repeats, _decode_slack(config, num_seqs, context_len))
            decode_samples.append(DecodeSample(num_seqs, num_context_tokens, step_s))
            bar.update(1)
    spec = engine.kv_spec
    return Profile(
        hardware=_hardware(config), model=_model_summary(engine, config),
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        kv_bytes_per_token=spec.bytes_per_block // spec.block_size,
        transfer_gb_per_s=_transfer_gb_per_s(engine, config),
        prefill=PrefillFit.fit(prefill_samples), decode=DecodeFit.fit(decode_samples),
        prefill_samples=prefill_samples, decode_samples=decode_samples)


def _decode_slack(config: MeasureConfig, num_seqs: int, context_len: int) -> int:
    """Output tokens a decode point's requests may take: one per step while the batch is
    prefilled (chunked under the token budget), the warm-up step and the timed ones, one to spare."""
    num_prefill_steps = -(-num_seqs * context_len // config.max_num_batched_tokens) + 1
    return num_prefill_steps + config.repeats + 2


def _num_blocks(config: MeasureConfig) -> int:
    """Room for the largest decode point (a block of slack per request) or the largest prefill."""
    most_tokens = max(2 * config.max_num_batched_tokens, *(
        num_seqs * (context_len + _decode_slack(config, num_seqs, context_len) + BLOCK_SIZE)
        for num_seqs in config.decode_num_seqs for context_len in config.decode_context_lens))
    return -(-most_tokens // BLOCK_SIZE)


def _ids(engine: LLMEngine, rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(engine.model_config.vocab_size) for _ in range(length)]


def _new_request_id() -> str:
    return f"profile-{next(_REQUEST_NUMBERS)}"


def _prefill_step_s(engine: LLMEngine, rng: random.Random, num_seqs: int, prompt_len: int, repeats: int) -> float:
    """The median of `repeats` timed steps, after an untimed warm-up one."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    timings_s = []
    for _ in range(repeats + 1):
        for _ in range(num_seqs):
            engine.add_request(_new_request_id(), _ids(engine, rng, prompt_len), params)
        start = time.perf_counter()
        engine.step()
        timings_s.append(time.perf_counter() - start)
        while engine.has_unfinished_requests():
            engine.step()
    return statistics.median(timings_s[1:])


def _decode_step_s(engine: LLMEngine, rng: random.Random, num_seqs: int, context_len: int,
                   repeats: int, max_tokens: int) -> tuple[float, int]:
    """The median of `repeats` timed steps after an untimed warm-up one, and the tokens the
    batch held when they began; `max_tokens` leaves room for the prefill phase and those steps
    (`_decode_slack`)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    request_ids = [_new_request_id() for _ in range(num_seqs)]
    for request_id in request_ids:
        engine.add_request(request_id, _ids(engine, rng, context_len), params)
    running = engine.scheduler.running
    while any(request.num_computed_tokens < request.num_prompt_tokens for request in running) \
            or engine.scheduler.waiting:
        engine.step()
    if len(running) != num_seqs:
        raise RuntimeError(f"decode point {num_seqs} x {context_len}: {len(running)} requests running, not all")
    num_context_tokens = sum(request.num_tokens for request in running)
    timings_s = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        engine.step()
        timings_s.append(time.perf_counter() - start)
    if len(running) != num_seqs:
        raise RuntimeError(f"decode point {num_seqs} x {context_len}: a request ended while timed")
    for request_id in request_ids:
        engine.abort_request(request_id)
    return statistics.median(timings_s[1:]), num_context_tokens


def _transfer_gb_per_s(engine: LLMEngine, config: MeasureConfig) -> float:
    spec = engine.kv_spec
    num_blocks = -(-config.transfer_num_tokens // spec.block_size)
    src = spec.allocate(num_blocks, engine.device)
    dst = spec.allocate(2 * num_blocks, engine.device)
    src_ids = list(range(num_blocks))
    dst_ids = random.Random(config.seed).sample(range(2 * num_blocks), num_blocks)
    timings_s = []
    for _ in range(config.repeats + 1):
        start = time.perf_counter()
        copy_blocks(dst, dst_ids, src, src_ids)
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        timings_s.append(time.perf_counter() - start)
    return num_blocks * spec.bytes_per_block / statistics.median(timings_s[1:]) / 1e9


def _hardware(config: MeasureConfig) -> dict:
    if config.device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(config.device))
    else:
        name = _cpu_model() or platform.processor()
    return {"device": config.device, "name": name, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "host": platform.node(),
            "load_average_1m": os.getloadavg()[0], "num_cpus": os.cpu_count()}  # what else loaded it


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _model_summary(engine: LLMEngine, config: MeasureConfig) -> dict:
    spec = engine.kv_spec
    return {"dir": str(config.model_dir), "dtype": str(engine.dtype).removeprefix("torch."),
            "num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
            "block_size": spec.block_size, "vocab_size": engine.model_config.vocab_size}
