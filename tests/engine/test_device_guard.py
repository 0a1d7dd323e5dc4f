"""Every thread that launches work for a replica on `cuda:K` asks CUDA for device K first.

`torch.cuda.set_device` is stubbed: these tests prove which device each thread asks for and
that it asks before its first launch; that the launches then run there takes two GPUs
(scripts/gpu_check.sh)."""
import asyncio
import threading

import pytest
import torch

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.device_guard import bind_thread, on_device, resolve_device

DEADLINE_S = 5.0


@pytest.fixture
def set_device_calls(monkeypatch) -> list[tuple[str, torch.device]]:
    """(thread name, device) of every `torch.cuda.set_device`, in order."""
    calls: list[tuple[str, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: calls.append((threading.current_thread().name, torch.device(device))))
    return calls


class OneStepEngine:
    """Has one step to run; records what the thread had asked for when the step ran."""

    def __init__(self, device: torch.device, set_device_calls: list):
        self.device = device
        self.calls = set_device_calls
        self.seen_at_step: list | None = None
        self.stepped = threading.Event()

    def has_unfinished_requests(self) -> bool:
        return self.seen_at_step is None

    def step(self) -> list:
        self.seen_at_step = list(self.calls)
        self.stepped.set()
        return []


def test_the_engine_thread_binds_the_replica_device_before_its_first_step(set_device_calls):
    engine = OneStepEngine(torch.device("cuda", 3), set_device_calls)

    async def go():
        async_engine = AsyncEngine(engine, asyncio.get_running_loop())
        async_engine.start()
        assert await asyncio.to_thread(engine.stepped.wait, DEADLINE_S)
        await async_engine.stop()

    asyncio.run(go())
    assert engine.seen_at_step == [("engine", torch.device("cuda", 3))]


def test_a_pooled_job_binds_its_thread_before_it_runs(set_device_calls):
    seen: list = []

    def job(value: int) -> int:
        seen.append((threading.current_thread().name, list(set_device_calls)))
        return value + 1

    async def go():
        return await asyncio.to_thread(on_device(torch.device("cuda", 1), job), 41)

    assert asyncio.run(go()) == 42
    [(thread_name, calls_before_job)] = seen
    assert thread_name != threading.current_thread().name
    assert calls_before_job == [(thread_name, torch.device("cuda", 1))]


def test_cpu_replicas_never_touch_cuda(set_device_calls):
    bind_thread(torch.device("cpu"))
    assert on_device(torch.device("cpu"), lambda: 7)() == 7
    assert set_device_calls == []


@pytest.mark.parametrize(("given", "resolved"), [
    ("cuda", torch.device("cuda", 0)), ("cuda:2", torch.device("cuda", 2)), ("cpu", torch.device("cpu"))])
def test_a_replica_device_always_carries_its_index(given, resolved):
    assert resolve_device(given) == resolved
