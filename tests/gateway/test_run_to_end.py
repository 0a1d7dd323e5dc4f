"""run_to_end: the work finishes however often its caller is cancelled, the caller's cancel is
raised after it, and work past its deadline is cancelled."""
import asyncio

import pytest

from pdserve.gateway.front.run_to_end import run_to_end


def test_work_finishes_through_repeated_cancels_and_the_cancel_is_raised_after_it():
    async def main():
        release, steps = asyncio.Event(), []

        async def work():
            steps.append("started")
            await asyncio.wait_for(release.wait(), 10)
            steps.append("done")

        caller = asyncio.create_task(run_to_end(work(), 10, "work"))
        await asyncio.sleep(0)
        for _ in range(3):
            caller.cancel()
            await asyncio.sleep(0)
        assert steps == ["started"] and not caller.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, 10)
        assert steps == ["started", "done"]

    asyncio.run(main())


def test_the_works_error_reaches_the_caller():
    async def fail():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(run_to_end(fail(), 10, "work"))


def test_work_past_its_deadline_is_cancelled():
    async def main():
        cancelled = asyncio.Event()

        async def hang():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        await run_to_end(hang(), 0.05, "work")
        await asyncio.wait_for(cancelled.wait(), 10)

    asyncio.run(main())
