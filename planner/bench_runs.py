"""Measured runs for the planner: a `pdserve up` system launched as `pdserve bench-compare`
launches it, and traces sent through `pdserve bench`'s runner.

One system at a time: `launched` starts the disaggregated system (its own Redis, 1 prefill and
`num_decode` decode replicas, each replica pinned to its own CPUs by `pdserve up`), yields it
(its `spec.base_url` to send to) and stops its whole process group on exit; `bench` sends
requests over the OpenAI HTTP API and returns the runner's result, TTFT and TPOT defined as
`pdserve bench` defines them.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path

from pdserve.bench.datasets import BenchRequest, make_dataset
from pdserve.bench.runner import BenchConfig, BenchResult, run_benchmark
from pdserve.bench.systems import Pinning, RunningSystem, SystemOptions, system_spec

logger = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 180.0


def all_cpus_pinning() -> Pinning:
    """Servers and client on every CPU this process may use: `pdserve up` splits them between its
    replicas (one core each on a two-core machine), the gateway, Redis and the client float."""
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    return Pinning(cpus, cpus)


@contextlib.contextmanager
def launched(model_dir: Path, num_decode: int, log_path: Path, pinning: Pinning | None = None,
             dtype: str = "float32") -> Iterator[RunningSystem]:
    """The running system, ready, while the block runs."""
    options = SystemOptions(model_dir=model_dir, static_max_batch_size=1, vllm_script=None,
                            startup_timeout_s=STARTUP_TIMEOUT_S, vllm_startup_timeout_s=STARTUP_TIMEOUT_S,
                            dtype=dtype, num_decode_replicas=num_decode)
    spec = system_spec("disaggregated", options)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    system = RunningSystem(spec, pinning or all_cpus_pinning(), log_path)
    try:
        system.wait_ready()
        yield system
    finally:
        system.stop()


def random_requests(model_dir: Path, num_prompts: int, input_len: int, output_len: int, seed: int,
                    range_ratio: float = 0.0, dataset: str = "random") -> list[BenchRequest]:
    from pdserve.engine.tokenizer import load_tokenizer

    return make_dataset(dataset, num_prompts=num_prompts, seed=seed, input_len=input_len, output_len=output_len,
                        range_ratio=range_ratio, tokenizer=load_tokenizer(model_dir))


def bench(base_url: str, requests: list[BenchRequest], label: str, request_rate: float = math.inf,
          max_concurrency: int | None = None, burstiness: float = 1.0, seed: int = 0,
          goodput_slos_ms: dict[str, float] | None = None, progress: bool = True, attempts: int = 2) -> BenchResult:
    """Runs the trace again (up to `attempts` in all) when a request failed, as one does when a
    replica's heartbeat lapsed on a loaded machine; raises when the last attempt failed too."""
    config = BenchConfig(backend="openai", target=base_url, request_rate=request_rate, burstiness=burstiness,
                         max_concurrency=max_concurrency, seed=seed, goodput_slos_ms=goodput_slos_ms or {},
                         label=label)
    for attempt in range(1, attempts + 1):
        result = asyncio.run(run_benchmark(config, requests, progress))
        if not result.metrics.failed:
            return result
        errors = sorted({record.error for record in result.records if record.error})
        logger.warning("%s: attempt %d of %d: %d requests failed: %s", label, attempt, attempts,
                       result.metrics.failed, errors[:3])
    raise RuntimeError(f"{label}: {result.metrics.failed} requests failed: {errors[:3]}")
