"""The gateway's OpenAI-compatible HTTP front (aiohttp).

Routes: POST /v1/completions, POST /v1/chat/completions (streamed as server-sent events or
answered whole), GET /v1/models, GET /health, GET /metrics.

Invariants:
- every error is OpenAI's JSON error body: 400 for bad input (the field named), 404 for an
  unknown model or route, 503 when the frontend is unavailable, 500 only for bugs. Errors before
  the first token keep their status; once a stream has started they arrive as an SSE error event.
- a generation never outlives its client: the handler polls the connection while it waits, and
  when the client is gone it cancels the work, which closes the frontend's generator and so
  aborts the request. This holds whether or not the server runs with aiohttp's
  handler_cancellation.
"""
import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Iterator

from aiohttp import web

from engine.errors import InvalidRequestError, PdserveError
from gateway.frontend_types import Frontend, StreamChunk, UnavailableError
from gateway.metrics import GatewayMetrics
from gateway.openai_protocol import (
    ApiError,
    ParsedRequest,
    Shaper,
    create_shaper,
    parse_chat_request,
    parse_completion_request,
)

logger = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.1
"""How often a waiting handler checks that its client is still connected."""

CANCEL_DEADLINE_S = 5.0
"""How long a handler waits for the frontend to close a generation whose client left."""

DEFAULT_MAX_BODY_BYTES = 64 * 2**20
"""Request bodies carry whole prompts (possibly as token id lists): far above aiohttp's 1 MiB."""

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client left before the answer"

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class ClientGoneError(PdserveError):
    """The client closed the connection before its answer was complete."""


class IncompleteStreamError(PdserveError):
    """The frontend's stream ended without a finish reason (a frontend bug)."""


def create_app(
    frontend: Frontend, metrics: GatewayMetrics, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> web.Application:
    api = _OpenAIApi(frontend, metrics)
    app = web.Application(client_max_size=max_body_bytes, middlewares=[api.errors_and_metrics])
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    app.router.add_get("/v1/models", api.models)
    app.router.add_get("/health", api.health)
    app.router.add_get("/metrics", api.metrics)
    return app


class _OpenAIApi:
    def __init__(self, frontend: Frontend, metrics: GatewayMetrics) -> None:
        self._frontend = frontend
        self._metrics = metrics

    @web.middleware
    async def errors_and_metrics(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except ApiError as exc:
            response = _error_response(exc)
        except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, body too large
            response = _error_response(ApiError(exc.status, exc.text or exc.reason))
        except Exception:
            logger.exception("%s %s failed", request.method, request.path)
            response = _error_response(ApiError(500, "internal server error", error_type="internal_error"))
        resource = request.match_info.route.resource
        self._metrics.on_http_response(resource.canonical if resource else "unmatched", response.status)
        return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _read_json(request)
        return await self._generate(request, parse_completion_request(body, self._frontend.model_name))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await _read_json(request)
        parsed = parse_chat_request(body, self._frontend.model_name, self._frontend.max_model_len)
        return await self._generate(request, parsed)

    async def models(self, request: web.Request) -> web.Response:
        name = self._frontend.model_name
        card = {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "pdserve",
            "root": name,
            "parent": None,
            "max_model_len": self._frontend.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        healthy = self._frontend.health()
        return web.json_response({"status": "ok" if healthy else "unavailable"}, status=200 if healthy else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": self._metrics.content_type})

    async def _generate(self, request: web.Request, parsed: ParsedRequest) -> web.StreamResponse:
        shaper = create_shaper(parsed, self._frontend.model_name, int(time.time()), self._token_text)
        with _frontend_errors():
            chunks = self._frontend.generate(parsed.generate_input)
        if parsed.stream:
            answer = _stream(request, chunks, shaper, parsed.include_usage)
        else:
            answer = _collect(chunks, shaper)
        try:
            return await _while_connected(request, answer)
        except ClientGoneError:
            return web.Response(status=CLIENT_CLOSED_REQUEST)

    def _token_text(self, token_id: int) -> str:
        return self._frontend.tokenizer.decode([token_id])


async def _read_json(request: web.Request) -> object:
    raw = await request.read()
    try:
        return json.loads(raw)
    except ValueError as exc:  # invalid JSON or invalid UTF-8
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc


@contextlib.contextmanager
def _frontend_errors() -> Iterator[None]:
    """Turns the frontend's typed errors into the HTTP errors they stand for."""
    try:
        yield
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc)) from exc
    except UnavailableError as exc:
        raise ApiError(503, str(exc), error_type="service_unavailable") from exc


def _disconnected(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _while_connected(request: web.Request, work: Coroutine):
    """Runs `work` to its result, cancelling it (and raising ClientGoneError) if the client leaves."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            if _disconnected(request):
                task.cancel()
                await asyncio.wait({task}, timeout=CANCEL_DEADLINE_S)
                if not task.done():
                    logger.error("a generation ignored its client leaving for %.1f s", CANCEL_DEADLINE_S)
                raise ClientGoneError("the client closed the connection")
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
    except asyncio.CancelledError:  # the server cancelled this handler: stop the work too
        task.cancel()
        raise
    return task.result()


async def _collect(chunks: AsyncIterator[StreamChunk], shaper: Shaper) -> web.Response:
    async with contextlib.aclosing(chunks):
        with _frontend_errors():
            collected = [chunk async for chunk in chunks]
    if not collected or collected[-1].finish_reason is None:
        raise IncompleteStreamError("the generation ended without a finish reason")
    return web.json_response(shaper.response(collected))


async def _stream(
    request: web.Request, chunks: AsyncIterator[StreamChunk], shaper: Shaper, include_usage: bool
) -> web.StreamResponse:
    """SSE: one event per shaped chunk, an optional usage event, then `data: [DONE]`.

    The first chunk is awaited before the response starts, so a request the frontend rejects
    still gets its HTTP error status. Leaving this function closes the generator: on a finished
    stream that is a no-op, on an unfinished one it aborts the request.
    """
    async with contextlib.aclosing(chunks):
        with _frontend_errors():
            first = await anext(chunks, None)
        if first is None:
            raise IncompleteStreamError("the generation ended before its first chunk")
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await _send(response.prepare(request))
        try:
            last = await _relay(response, first, chunks, shaper)
            tail = [shaper.usage_event(last)] if include_usage else []
        except ApiError as exc:
            tail = [exc.body()]
        except ClientGoneError:
            raise
        except Exception:
            logger.exception("a streamed generation failed")
            tail = [ApiError(500, "internal server error", error_type="internal_error").body()]
        for event in tail:
            await _send(response.write(_sse(event)))
        await _send(response.write(b"data: [DONE]\n\n"))
        await _send(response.write_eof())
    return response


async def _relay(
    response: web.StreamResponse, first: StreamChunk, chunks: AsyncIterator[StreamChunk], shaper: Shaper
) -> StreamChunk:
    """Writes `first` and every following chunk; returns the last one, which has finished."""
    last = first
    for event in shaper.chunk_events(first):
        await _send(response.write(_sse(event)))
    with _frontend_errors():
        async for last in chunks:
            for event in shaper.chunk_events(last):
                await _send(response.write(_sse(event)))
    if last.finish_reason is None:
        raise IncompleteStreamError("the generation ended without a finish reason")
    return last


async def _send(write: Coroutine) -> None:
    """Awaits one write to the client; a connection error there means the client left."""
    try:
        await write
    except ConnectionError as exc:  # aiohttp's ClientConnectionResetError among them
        raise ClientGoneError("the client closed the connection mid-stream") from exc


def _sse(event: dict) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


def _error_response(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status)
