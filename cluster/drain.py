"""Waiting out a drain: a process that stops taking work waits until what it holds has ended.

Idle has to hold for `SETTLE_S` before it counts: a request routed here just before the process
stopped taking new ones can still be between its routing and its first call, and is not
stranded.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DRAIN_POLL_INTERVAL_S = 0.05
SETTLE_S = 0.5


async def drain(num_in_flight: Callable[[], int], timeout_s: float) -> bool:
    """Waits until num_in_flight() has read 0 for SETTLE_S; False if timeout_s passes first."""
    deadline_s = time.monotonic() + timeout_s
    idle_since_s = None
    while (now_s := time.monotonic()) < deadline_s:
        if num_in_flight() > 0:
            idle_since_s = None
        elif idle_since_s is None:
            idle_since_s = now_s
        elif now_s - idle_since_s >= SETTLE_S:
            return True
        await asyncio.sleep(DRAIN_POLL_INTERVAL_S)
    return num_in_flight() == 0
