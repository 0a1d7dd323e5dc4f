"""How the micro-benchmarks time a call and what a device's memory delivers.

A call's time is the best of its repeats after one untimed warm-up, the device synchronised
after each on a GPU so that the clock covers the work, not its launch. Read bandwidth is a
float32 sum over a buffer far larger than the caches, bytes read per second over a few
back-to-back sums on the calling threads: what a kernel that only streams can get, rather
than a datasheet peak, and the yardstick of every roofline here.
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


def best_s(fn: Callable[[], object], repeats: int, device: torch.device = CPU) -> float:
    fn()
    synchronize(device)
    timings_s = []
    for _ in range(repeats):
        start_s = time.perf_counter()
        fn()
        synchronize(device)
        timings_s.append(time.perf_counter() - start_s)
    return min(timings_s)


def read_gbps(device: torch.device = CPU, num_iters: int = 5) -> float:
    buffer = torch.ones(READ_BUFFER_BYTES // 4, dtype=torch.float32, device=device)
    buffer.sum()
    synchronize(device)
    start_s = time.perf_counter()
    for _ in range(num_iters):
        buffer.sum()
    synchronize(device)
    return READ_BUFFER_BYTES * num_iters / (time.perf_counter() - start_s) / 1e9
