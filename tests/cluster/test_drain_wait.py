"""A draining process stops once nothing has been in flight for the settle time, or at its deadline."""
import asyncio
import time

from pdserve.cluster import drain as drain_module
from pdserve.cluster.drain import drain


def test_drain_returns_once_idle_has_held_for_the_settle_time():
    counts = iter([2, 1, 0, 1, 0])  # then idle for good

    started_s = time.monotonic()
    assert asyncio.run(drain(lambda: next(counts, 0), timeout_s=10.0))
    assert drain_module.SETTLE_S <= time.monotonic() - started_s < 5.0


def test_drain_gives_up_at_its_deadline_while_requests_stay_in_flight():
    started_s = time.monotonic()
    assert not asyncio.run(drain(lambda: 1, timeout_s=0.3))
    assert 0.3 <= time.monotonic() - started_s < 3.0
