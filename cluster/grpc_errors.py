"""Domain errors → gRPC status codes, applied only at the service edge.

Domain code raises typed errors; a servicer method wrapped with `grpc_errors` aborts the call
with the code of the error's category (engine.errors) and the error's message. An error that
carries a downstream replica's status (`grpc_code`) and a failed downstream call keep that
status. Anything else is a bug: INTERNAL, logged.

An error that names the side of a KV transfer at fault (`failed_side`, protocol.errors.
TransferError) also sends it as trailing metadata `pdserve-failed-side` ("prefill" or "decode"):
the gateway reads it to move the request off the replica that failed it.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import logging

import grpc

from pdserve.protocol.errors import (AbortedError, InvalidRequestError, NotFoundError, PreconditionError,
                                     ResourceExhaustedError, UnavailableError)

logger = logging.getLogger(__name__)
FAILED_SIDE_KEY = "pdserve-failed-side"

_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (AbortedError, grpc.StatusCode.ABORTED),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
]


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    code = getattr(exc, "grpc_code", None)  # errors that carry a downstream replica's status
    if code is not None:
        return code, str(exc)
    for error_type, code in _CODES:
        if isinstance(exc, error_type):
            return code, str(exc) or type(exc).__name__
    if isinstance(exc, grpc.aio.AioRpcError):  # a downstream call failed: pass its status on
        return exc.code(), exc.details() or exc.code().name
    return None


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, method: str):
    status = status_for(exc)
    if status is None:
        logger.exception("%s failed", method)
        status = grpc.StatusCode.INTERNAL, f"internal error: {exc!r}"
    failed_side = getattr(exc, "failed_side", None)
    if failed_side is not None:
        context.set_trailing_metadata((*(context.trailing_metadata() or ()), (FAILED_SIDE_KEY, failed_side)))
    await context.abort(*status)


def grpc_errors(method):
    """Wraps a unary or server-streaming grpc.aio servicer method."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream_wrapper(self, request, context):
            try:
                async for item in method(self, request, context):
                    yield item
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:
                await _abort(context, exc, method.__qualname__)
        return stream_wrapper

    @functools.wraps(method)
    async def unary_wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await _abort(context, exc, method.__qualname__)
    return unary_wrapper
