"""Runs an aiohttp app on a host and port until the process is told to stop.

aiohttp's own signal handling is off (`handle_signals=False`): the process decides its shutdown
order, so each server here waits for SIGTERM/SIGINT itself, then cleans up in order.

The access log has one line per request, in aiohttp's format, except for the machine traffic of
`QUIET_PATHS`: health probes (`pdserve up` polls /health five times a second while it starts,
orchestrators every few seconds) and metrics scrapes would otherwise bury the requests.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.web_log import AccessLogger

QUIET_PATHS = frozenset({"/health", "/metrics"})


class RequestAccessLogger(AccessLogger):
    """aiohttp's access log without the lines of `QUIET_PATHS`."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if request.path not in QUIET_PATHS:
            super().log(request, response, time)


@contextlib.asynccontextmanager
async def serving_http(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[web.AppRunner]:
    """Serves `app` on host:port (HTTPS with `ssl_context`) inside the block; leaving it runs
    the app's cleanup."""
    runner = web.AppRunner(app, handle_signals=False, access_log_class=RequestAccessLogger)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
        yield runner
    finally:
        await runner.cleanup()


async def wait_for_stop_signal() -> None:
    """Returns on the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
