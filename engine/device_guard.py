"""Which CUDA device each thread of a replica launches on.

CUDA's current device belongs to a host thread and is 0 on every new thread, and Triton launches
on the current device's current stream whatever device its tensors live on. So a replica on
`cuda:K` makes K current (`bind_thread`) on every thread that launches kernels or copies: the
thread that builds the engine (weights, KV pool), the engine thread before its first step, and
each pooled worker job that copies KV (`on_device`). On CPU all of this does nothing.

Proven on CPU (tests stub `torch.cuda.set_device`): each of those threads asks for the
replica's device before it launches anything. Proven only on a machine with two GPUs
(scripts/gpu_check.sh): that the launches then run on that device.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
T = TypeVar("T")


def resolve_device(device: str | torch.device) -> torch.device:
    """`device` with its index filled in: plain "cuda" is cuda:0, the number CUDA IPC exchanges."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", 0)
    return device


def bind_thread(device: torch.device) -> None:
    """Makes `device` the calling thread's current CUDA device; nothing unless it is one."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def on_device(device: torch.device, fn: Callable[P, T]) -> Callable[P, T]:
    """`fn`, binding the thread it runs on to `device` first: for jobs on pooled threads
    (`asyncio.to_thread`), which may last have run for another device or none."""
    @functools.wraps(fn)
    def bound(*args: P.args, **kwargs: P.kwargs) -> T:
        bind_thread(device)
        return fn(*args, **kwargs)
    return bound
