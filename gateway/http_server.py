"""Runs an aiohttp app on a host and port until the process is told to stop.

aiohttp's own signal handling is off (`handle_signals=False`): the process decides its shutdown
order, so each server here waits for SIGTERM/SIGINT itself, then cleans up in order.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serving_http(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[web.AppRunner]:
    """Serves `app` on host:port (HTTPS with `ssl_context`) inside the block; leaving it runs
    the app's cleanup."""
    runner = web.AppRunner(app, handle_signals=False)
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
