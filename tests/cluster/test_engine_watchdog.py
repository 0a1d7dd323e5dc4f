"""The engine watchdog: it fires once the engine thread has been silent for the stall time, never
while the engine comes round, and a pause of the whole process does not count against the engine."""
import asyncio
import time

import pytest

from pdserve.cluster.engine_watchdog import watch_engine

WAIT_S = 5.0


def test_it_fires_once_the_engine_is_silent_for_the_stall_time():
    async def main():
        silent_since_s = time.monotonic()
        started_s = time.monotonic()
        silent_s = await asyncio.wait_for(watch_engine(lambda: silent_since_s, 0.2, tick_s=0.01), WAIT_S)
        return silent_s, time.monotonic() - started_s
    silent_s, waited_s = asyncio.run(main())
    assert silent_s > 0.2 and waited_s >= 0.2


def test_it_stays_quiet_while_the_engine_comes_round():
    async def main():
        watch = asyncio.create_task(watch_engine(time.monotonic, 0.05, tick_s=0.01))
        await asyncio.sleep(0.5)
        fired = watch.done()
        watch.cancel()
        return fired
    assert not asyncio.run(main())


def test_a_late_tick_restarts_the_count_instead_of_blaming_the_engine():
    """The clock jumps 60 s between two ticks (the process was stopped): the engine's last round,
    from before the pause, is not held against it until the stall time has passed after it."""
    now = [1000.0]

    def clock() -> float:
        return now[0]

    async def main():
        watch = asyncio.create_task(watch_engine(lambda: 1000.0, 10.0, tick_s=0.01, clock=clock))
        await asyncio.sleep(0.05)
        now[0] += 60.0  # the pause
        await asyncio.sleep(0.05)
        paused_fired = watch.done()
        for _ in range(20):  # ticks on time again, a second apart; the engine still silent
            if watch.done():
                break
            now[0] += 1.0
            await asyncio.sleep(0.05)
        return paused_fired, await asyncio.wait_for(watch, WAIT_S)
    paused_fired, silent_s = asyncio.run(main())
    assert not paused_fired
    assert silent_s == pytest.approx(11.0)  # counted from the resume at 1060, not from 1000
