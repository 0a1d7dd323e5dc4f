"""Clean-up that runs to its end even when the task awaiting it is cancelled, up to a deadline.

A request's end (abort on its replicas, its terminal record) must happen however the request
stops. A client that leaves can cancel the task that drives it more than once: aiohttp cancels
the handler while the HTTP front's own disconnect poll is cancelling the work already, and a gRPC
cancel can land while an abort is in flight. `asyncio.shield` protects the work from the first
of those only: the next cancel raises out of the await and whatever came after it never runs.
`run_to_end` waits through every cancel until the work is done (or cancels it at `deadline_s`),
then lets the cancellation go on.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

logger = logging.getLogger(__name__)


async def run_to_end(work: Awaitable, deadline_s: float, what: str) -> None:
    """Awaits `work` as a task of its own and raises its error; a cancel of the caller is raised
    only once the work is over. Work still running at `deadline_s` is cancelled, with a line logged."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    cancelled = False
    while not task.done() and (remaining_s := deadline - loop.time()) > 0:
        try:
            await asyncio.wait({task}, timeout=remaining_s)  # a cancel here leaves the task running
        except asyncio.CancelledError:
            cancelled = True
    if not task.done():
        logger.warning("%s did not finish within %.1f s; cancelled", what, deadline_s)
        task.cancel()
    error = task.exception() if task.done() and not task.cancelled() else None
    if cancelled:
        raise asyncio.CancelledError
    if error is not None:
        raise error
