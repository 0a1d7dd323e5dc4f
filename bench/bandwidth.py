"""How the micro-benchmarks time a call and what a device's memory delivers.

A call's time is the best of its repeats after an untimed warm-up, synchronised on a GPU so the
clock covers the work, not its launch. Read bandwidth is a float32 sum over a buffer far larger
than the caches on the calling threads: what a kernel that only streams can get, the yardstick
of every roofline here.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

READ_BUFFER_BYTES = 1 << 30
CPU = torch.device("cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_s(fn: Callable[[], object], device: torch.device = CPU) -> float:
    """One call's seconds, the device synchronised after it."""
    start_s = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start_s


def best_s(fn: Callable[[], object], repeats: int, device: torch.device = CPU) -> float:
    timed_s(fn, device)  # the warm-up
    return min(timed_s(fn, device) for _ in range(repeats))


def read_gbps(device: torch.device = CPU, num_iters: int = 5) -> float:
    buffer = torch.ones(READ_BUFFER_BYTES // 4, dtype=torch.float32, device=device)
    seconds = best_s(lambda: [buffer.sum() for _ in range(num_iters)], 1, device)
    return READ_BUFFER_BYTES * num_iters / seconds / 1e9
