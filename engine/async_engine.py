"""Drives an `LLMEngine` on its own thread for asyncio callers.

The engine is single-threaded: only the engine thread touches it. Callers submit commands
(`call`), which run between two steps, and receive each request's outputs either on its own
asyncio queue (`open_stream`) or, with other requests of the same client, on an `OutputGroup`
(`join_group`) that gets one put per engine step. The thread steps while any request is
unfinished and otherwise sleeps on the command queue, so an idle replica burns no CPU.
`came_round_s` is when the thread last came round its loop: at least every COMMAND_WAIT_S when
idle, after every step when busy; a watchdog (cluster/engine_watchdog.py) reads it. Idle for
IDLE_TRIM_S after a step, the thread hands the C heap's free memory back to the system once
(engine/heap_trim.py): the passing tensors of a long prefill would otherwise keep the process as
large as at that step's peak. With a core lease (`cores`), the thread tells it before each step
and whenever it finds no work (engine/core_lease.py).

Invariant: every command's future is resolved (result or exception), and every stream sees its
request's outputs in order, ending with one that has `finished=True` or with an exception item
(`AbortedError`, `EngineDeadError`), unless the stream is closed first. A request in a
group sees the same sequence as entries of the group's lists (its failure as a
`RequestFailure`; the engine's death as an exception item of the group).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pdserve.engine.device_guard import bind_thread
from pdserve.engine.heap_trim import release_freed_memory
from pdserve.engine.output_group import GroupEntry, OutputGroup
from pdserve.engine.thread_name import ENGINE_THREAD_NAME, name_this_thread
from pdserve.protocol.errors import AbortedError, UnavailableError
from pdserve.protocol.outputs import RequestOutput

if TYPE_CHECKING:  # its errors are mapped where torch is never loaded (the gateway's gRPC edge)
    from pdserve.engine.core_lease import Borrower, Lender
    from pdserve.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)
T = TypeVar("T")
COMMAND_WAIT_S = 0.5  # an idle engine thread comes round at least this often
IDLE_TRIM_S = 1.0  # this long without a step, the engine thread trims the heap (once)


class EngineDeadError(UnavailableError, RuntimeError):
    """The engine thread stopped after an unexpected error; the replica must be restarted."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self._loop = loop
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._groups: dict[str, OutputGroup] = {}  # request id -> the group its outputs go to
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=ENGINE_THREAD_NAME, daemon=True)
        self.on_step: Callable[[LLMEngine], None] | None = None  # called on the engine thread
        self.cores: Lender | Borrower | None = None  # a core lease's side (engine/core_lease.py), if any
        self.came_round_s = time.monotonic()  # written by the engine thread only

    def start(self) -> None:
        # Tried and not kept: a 0.5 ms interpreter switch interval (sys.setswitchinterval), so that the
        # event loop's thread cannot keep the GIL for 5 ms between two of the engine's ops. `pdserve
        # serve` at 2.5-3.5 req/s (bfloat16, AMD EPYC, alternated twice): engine 98-99 % busy either
        # way, 21 and 40 % of requests meeting the SLOs at 3 req/s against 50 and 100.
        self._thread.start()

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._commands.put(None)
        await asyncio.to_thread(self._thread.join, timeout_s)

    def call(self, fn: Callable[[LLMEngine], T]) -> asyncio.Future[T]:
        """Queues `fn(engine)` to run on the engine thread between steps, in order with every
        other `call` and `submit`; the future gets its result."""
        future = self._loop.create_future()
        if self._error is not None:
            future.set_exception(EngineDeadError(f"engine stopped: {self._error!r}"))
        else:
            self._commands.put((fn, future))
        return future

    def submit(self, fn: Callable[[LLMEngine], Any]) -> None:
        """Runs `fn(engine)` between steps without waiting: for clean-up that must happen even
        when the caller is being cancelled (aborts, releases). Errors are logged."""
        self._commands.put((fn, None))

    async def abort(self, request_id: str) -> bool:
        """Aborts the request (or drops its reservation / held KV); a reader of its stream gets
        `AbortedError` instead of waiting for outputs that will never come."""
        aborted = await self.call(lambda engine: engine.abort_request(request_id))
        error = AbortedError(f"request {request_id} was aborted")
        if (stream := self._streams.get(request_id)) is not None:
            stream.put_nowait(error)
        if (group := self._groups.get(request_id)) is not None:
            group.fail(request_id, error)
        return aborted

    def open_stream(self, request_id: str) -> asyncio.Queue[RequestOutput]:
        """Registers a queue for the request's outputs; call before adding the request."""
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request_id] = stream
        return stream

    def join_group(self, request_id: str, group: OutputGroup) -> None:
        """Sends the request's outputs to `group`; call before adding the request."""
        self._groups[request_id] = group

    def close_stream(self, request_id: str) -> None:
        """Stops delivering the request's outputs, to its stream or its group."""
        self._streams.pop(request_id, None)
        self._groups.pop(request_id, None)

    def _run(self) -> None:
        name_this_thread(ENGINE_THREAD_NAME)
        try:
            bind_thread(self.engine.device)
            last_step_s, trimmed = time.monotonic(), True
            while not self._stopping.is_set():
                self.came_round_s = time.monotonic()
                self._drain_commands(block=not self.engine.has_unfinished_requests())
                if not self.engine.has_unfinished_requests():
                    if self.cores is not None:
                        self.cores.idle()
                    if not trimmed and time.monotonic() - last_step_s >= IDLE_TRIM_S:
                        release_freed_memory()
                        trimmed = True
                else:
                    if self.cores is not None:
                        self.cores.before_step()
                    outputs = self.engine.step()
                    last_step_s, trimmed = time.monotonic(), False
                    if self.on_step is not None:
                        self.on_step(self.engine)
                    if outputs:
                        self._loop.call_soon_threadsafe(self._dispatch, outputs)
        except BaseException as exc:  # the replica cannot continue; fail every waiter loudly
            logger.exception("engine thread died")
            self._error = exc
            self._loop.call_soon_threadsafe(self._fail_all, exc)

    def _drain_commands(self, block: bool) -> None:
        while True:
            try:
                item = self._commands.get(block=block, timeout=COMMAND_WAIT_S if block else None)
            except queue.Empty:
                return
            if item is None:
                return
            fn, future = item
            try:
                result = fn(self.engine)
            except Exception as exc:
                if future is None:
                    logger.exception("engine command failed")
                else:
                    self._loop.call_soon_threadsafe(_resolve, future, None, exc)
            else:
                if future is not None:
                    self._loop.call_soon_threadsafe(_resolve, future, result, None)
            block = False

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        by_group: dict[OutputGroup, list[GroupEntry]] = {}
        for output in outputs:
            if (group := self._groups.get(output.request_id)) is not None:
                by_group.setdefault(group, []).append(output)
            elif (stream := self._streams.get(output.request_id)) is not None:
                stream.put_nowait(output)
        for group, entries in by_group.items():
            group.put(entries)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in self._streams.values():
            stream.put_nowait(EngineDeadError(f"engine stopped: {exc!r}"))
        for group in set(self._groups.values()):
            group.end(EngineDeadError(f"engine stopped: {exc!r}"))


def _resolve(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
