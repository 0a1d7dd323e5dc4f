"""Offline engine micro-benchmark: a fixed, seeded workload through `engine.LLM` on one process.

Not a test and not the serving benchmark: it measures the engine's own step loop (scheduler,
runner, sampler, output processing) so that changes to them can be compared A/B on one machine.
The workload is random prompt token ids with seeded lengths, greedy, `ignore_eos`, so every
run generates exactly `num_prompts * output_len` tokens. The printed digest of all output ids
must not change when an optimisation claims to keep behaviour.

    python -m bench.profile_engine                       # tiny default model, 64 prompts
    python -m bench.profile_engine --num-prompts 16 --repeats 3

The breakdown times the engine's parts by wrapping them on this run's engine object only.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.engine import LLM, SamplingParams
from pdserve.checkpoints.tiny_model import write_tiny_model


@dataclass(frozen=True, slots=True)
class Workload:
    num_prompts: int
    min_prompt_len: int
    max_prompt_len: int
    output_len: int
    seed: int

    def prompts(self, vocab_size: int) -> list[list[int]]:
        rng = random.Random(self.seed)
        lengths = [rng.randint(self.min_prompt_len, self.max_prompt_len) for _ in range(self.num_prompts)]
        return [[rng.randrange(vocab_size) for _ in range(length)] for length in lengths]


@dataclass(frozen=True, slots=True)
class RunResult:
    elapsed_s: float
    num_output_tokens: int
    num_steps: int
    part_s: dict[str, float]  # wall seconds spent in each timed part
    digest: str  # of every request's output ids, in prompt order


class _Timers:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.num_steps = 0

    def wrap(self, owner: object, attribute: str, name: str) -> None:
        inner: Callable = getattr(owner, attribute)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        setattr(owner, attribute, timed)


def run_once(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> RunResult:
    engine = llm.engine
    timers = _Timers()
    timers.wrap(engine.scheduler, "schedule", "schedule")
    timers.wrap(engine.runner, "run", "runner.run")
    timers.wrap(engine.runner.model, "forward", "runner.run: model forward")
    timers.wrap(engine.runner.model, "compute_logits", "runner.run: logits")
    timers.wrap(engine, "_update", "update (scheduler + output processor)")
    step = engine.step

    def counted_step():
        timers.num_steps += 1
        return step()

    engine.step = counted_step
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed_s = time.perf_counter() - start
    for attribute, owner in (("schedule", engine.scheduler), ("run", engine.runner), ("_update", engine),
                             ("step", engine), ("forward", engine.runner.model),
                             ("compute_logits", engine.runner.model)):
        delattr(owner, attribute)

    digest = hashlib.sha256()
    num_output_tokens = 0
    for output in outputs:
        token_ids = output.outputs[0].token_ids
        num_output_tokens += len(token_ids)
        digest.update(repr(token_ids).encode())
    return RunResult(elapsed_s, num_output_tokens, timers.num_steps, dict(timers.seconds), digest.hexdigest()[:16])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder; default: the tiny model written to a temp dir")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--min-prompt-len", type=int, default=128)
    parser.add_argument("--max-prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs after one warm-up run")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for this process")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    workload = Workload(args.num_prompts, args.min_prompt_len, args.max_prompt_len, args.output_len, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or str(write_tiny_model(Path(tmp) / "tiny"))
        llm = LLM(model_dir, dtype=args.dtype, max_num_batched_tokens=args.max_num_batched_tokens,
                  kv_cache_bytes=1 << 30)
        prompts = workload.prompts(llm.engine.model_config.vocab_size)
        params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
        warm_up = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        run_once(llm, prompts[:4], warm_up)  # allocator caches, lazy imports
        results = [run_once(llm, prompts, params) for _ in range(args.repeats)]

    print(f"workload: {workload}, dtype {args.dtype}, torch threads {torch.get_num_threads()}")
    for result in results:
        print(f"run: {result.elapsed_s:.2f} s, {result.num_output_tokens / result.elapsed_s:.1f} output tok/s, "
              f"{result.num_steps / result.elapsed_s:.1f} steps/s, digest {result.digest}")
    median = sorted(results, key=lambda r: r.elapsed_s)[len(results) // 2]
    print(f"median: {median.num_output_tokens / median.elapsed_s:.1f} output tok/s, "
          f"{median.num_steps / median.elapsed_s:.1f} steps/s over {median.num_steps} steps")
    for name, seconds in sorted(median.part_s.items()):
        print(f"  {name:<40} {seconds:7.2f} s  {100 * seconds / median.elapsed_s:5.1f} %")


if __name__ == "__main__":
    main()
