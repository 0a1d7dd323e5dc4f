"""The engine watchdog: a replica whose engine thread stops coming round its loop leaves.

The replica's gRPC server, its heartbeat and its keepalive answers all run beside the engine
thread, so an engine that hangs (a stuck kernel, a deadlock) leaves a replica that looks alive:
registered, SERVING, reporting the load it had. `watch_engine` returns once the engine thread
has not come round (`AsyncEngine.came_round_s`: every step, and at least twice a second when
idle) for `stall_s`; the replica then leaves the registry, reports NOT_SERVING, ends its
requests with UNAVAILABLE so that gateways move them elsewhere, and exits for its supervisor
to restart it (cluster/replica_server.py).

Time the whole process was paused (SIGSTOP, a frozen VM) is not counted against the engine:
the watchdog's own ticks stop then too, and a tick that comes late restarts the count.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEFAULT_STALL_S = 300.0  # longer than any legitimate step: a long prompt chunk of a larger model on one CPU core
TICK_S = 1.0
LATE_TICK_S = 2.0  # a tick this much later than due: the process (or its event loop) was held


async def watch_engine(came_round_s: Callable[[], float], stall_s: float, tick_s: float = TICK_S,
                       clock: Callable[[], float] = time.monotonic) -> float:
    """Returns how long the engine has been silent, once that passes `stall_s`."""
    counted_from_s = last_tick_s = clock()
    while True:
        await asyncio.sleep(tick_s)
        now_s = clock()
        if now_s - last_tick_s > tick_s + LATE_TICK_S:
            counted_from_s = now_s
        last_tick_s = now_s
        silent_s = now_s - max(came_round_s(), counted_from_s)
        if silent_s > stall_s:
            return silent_s
