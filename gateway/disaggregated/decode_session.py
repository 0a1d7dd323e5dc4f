"""A gateway's session with one decode replica: one bidirectional stream for all its requests.

    generate(request) ──DecodeCommand──▶ replica ──DecodeStepOutputs, one per engine step──▶
    reader ──▶ each request's queue ──▶ that request's iterator of DecodeStep

Commands are queued, never awaited, so closing a request's iterator early sends its abort
command even while its task is being cancelled. A request's queue ends with its finished step
or an error. If the stream breaks, every request on it fails at once with SessionBrokenError and
the session stays `broken`: its client opens a new one for the next request.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from pdserve.cluster.proto_convert import FINISH_REASON_NAMES, logprobs_from_proto
from pdserve.gateway.disaggregated.backend_errors import (BackendError, ReplicaStalledError, SessionBrokenError,
                                                         backend_error)
from pdserve.gateway.disaggregated.completion_text import SampledToken
from pdserve.v1 import decode_pb2, decode_pb2_grpc

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DecodeStep:
    tokens: list[SampledToken]  # new this step; only the last may carry a finish reason
    num_preemptions: int  # of the request so far

    @property
    def finished(self) -> bool:
        return bool(self.tokens) and self.tokens[-1].finish_reason is not None


class DecodeSession:
    def __init__(self, replica_id: str, stub: decode_pb2_grpc.DecodeStub):
        self.replica_id = replica_id
        self.broken = False
        self._commands: asyncio.Queue[decode_pb2.DecodeCommand] = asyncio.Queue()
        self._requests: dict[str, asyncio.Queue[DecodeStep | Exception]] = {}
        self._call = stub.Session(self._command_stream())
        self._reader = asyncio.create_task(self._read())

    async def generate(self, request: decode_pb2.DecodeRequest, token_timeout_s: float,
                       request_timeout_s: float) -> AsyncIterator[DecodeStep]:
        """The request's steps until one finishes it. Raises SessionBrokenError, a BackendError
        with the replica's status for this request, ReplicaStalledError when no step comes in
        `token_timeout_s`, or DEADLINE_EXCEEDED when the request outlives `request_timeout_s`."""
        request_id = request.request_id
        if self.broken:
            raise SessionBrokenError(self.replica_id, f"decode replica {self.replica_id}: session is broken")
        steps = self._requests[request_id] = asyncio.Queue()
        self._commands.put_nowait(decode_pb2.DecodeCommand(generate=request))
        deadline_s = time.monotonic() + request_timeout_s
        ended = False
        try:
            while not ended:
                left_s = deadline_s - time.monotonic()
                try:
                    item = await asyncio.wait_for(steps.get(), min(token_timeout_s, left_s))
                except TimeoutError:
                    if left_s <= token_timeout_s:
                        raise BackendError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                           f"{self.replica_id}: request {request_id} ran past its "
                                           f"{request_timeout_s:g} s") from None
                    raise ReplicaStalledError(self.replica_id, f"decode replica {self.replica_id}: request "
                                              f"{request_id} got no step in {token_timeout_s:g} s") from None
                if isinstance(item, Exception):
                    ended = True
                    raise item
                ended = item.finished
                yield item
        finally:
            del self._requests[request_id]
            if not ended and not self.broken:
                self._commands.put_nowait(decode_pb2.DecodeCommand(abort_request_id=request_id))

    def close(self) -> None:
        """Ends the stream; the replica aborts whatever still runs on it."""
        self._call.cancel()

    async def _command_stream(self) -> AsyncIterator[decode_pb2.DecodeCommand]:
        while True:
            yield await self._commands.get()

    async def _read(self) -> None:
        reason = "the replica ended it"
        try:
            async for message in self._call:
                for output in message.outputs:
                    steps = self._requests.get(output.request_id)
                    if steps is not None:
                        steps.put_nowait(_step_or_error(self.replica_id, output))
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            reason = "closed by the gateway"
        except Exception as exc:
            logger.exception("decode session with %s failed", self.replica_id)
            reason = repr(exc)
        self.broken = True
        for steps in self._requests.values():
            steps.put_nowait(SessionBrokenError(self.replica_id, f"decode replica {self.replica_id}: session broke ({reason})"))


def _step_or_error(replica_id: str, output: decode_pb2.DecodeRequestOutput) -> DecodeStep | Exception:
    if output.HasField("error"):
        return backend_error(replica_id, output.error.status_code, output.error.message)
    last = len(output.token_ids) - 1
    finish_reason = FINISH_REASON_NAMES[output.finish_reason]
    stop_token_id = output.stop_token_id if output.HasField("stop_token_id") else None
    tokens = [SampledToken(token_id, logprobs_from_proto(output.logprobs[i]) if output.logprobs else None,
                           finish_reason if i == last else None, stop_token_id if i == last else None)
              for i, token_id in enumerate(output.token_ids)]
    return DecodeStep(tokens, output.num_preemptions)
