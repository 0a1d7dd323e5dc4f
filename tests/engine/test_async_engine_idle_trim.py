"""An engine thread idle for IDLE_TRIM_S after a step returns the heap's free memory once, and
not again until it has stepped since; an engine that never stepped returns none."""
import asyncio
import time

from pdserve.engine import async_engine as async_engine_module
from pdserve.engine.async_engine import COMMAND_WAIT_S, IDLE_TRIM_S, AsyncEngine
from tests.engine.test_async_engine_groups import ScriptedEngine, get

DEADLINE_S = 10 * (IDLE_TRIM_S + COMMAND_WAIT_S)


async def came_round(async_engine: AsyncEngine, times: int) -> None:
    """Waits until the engine thread has come round its loop `times` more times."""
    deadline = time.monotonic() + DEADLINE_S
    for _ in range(times):
        since = async_engine.came_round_s
        while async_engine.came_round_s == since:
            assert time.monotonic() < deadline, "the engine thread stopped coming round"
            await asyncio.sleep(0.01)


async def trimmed_to(trims: list, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while len(trims) < count:
        assert time.monotonic() < deadline, f"{len(trims)} trims, waited for {count}"
        await asyncio.sleep(0.01)


def test_an_idle_engine_trims_once_after_each_busy_spell(monkeypatch):
    trims = []
    monkeypatch.setattr(async_engine_module, "release_freed_memory", lambda: trims.append(time.monotonic()))

    async def go():
        engine = ScriptedEngine(num_tokens=2)
        async_engine = AsyncEngine(engine, asyncio.get_running_loop())
        async_engine.start()
        await came_round(async_engine, 2)
        assert trims == []  # nothing stepped, nothing to give back
        for spell, request_id in enumerate(("a", "b"), start=1):
            stream = async_engine.open_stream(request_id)
            await async_engine.call(lambda e, request_id=request_id: e.add(request_id))
            while not (await get(stream)).finished:
                pass
            finished_s = time.monotonic()
            await trimmed_to(trims, spell)
            assert trims[-1] - finished_s >= IDLE_TRIM_S - COMMAND_WAIT_S
            await came_round(async_engine, 2)
            assert len(trims) == spell  # once a spell
        await async_engine.stop()

    asyncio.run(go())
