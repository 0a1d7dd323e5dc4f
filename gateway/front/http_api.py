"""The gateway's OpenAI-compatible HTTP front (aiohttp).

Routes: POST /v1/completions, POST /v1/chat/completions (streamed as server-sent events or
answered whole), GET /v1/models, POST /tokenize, POST /detokenize (vLLM's), GET /health,
GET /metrics.

A generation request asks for `n` choices of each of its prompts; each choice is its own engine
request, driven through the `Frontend` protocol and merged back into one answer (`fan_out`).
Every response carries an `X-Request-Id` header: the client's, when it sent one, else a fresh
id. It names the answer ("cmpl-<id>", "chatcmpl-<id>") and its engine requests.

With API keys configured (`api_keys`), every route but /health and /metrics needs
`Authorization: Bearer KEY`, and the caller's fingerprint becomes the owner of the requests it
creates. A generation holds one admission slot per choice until it ends (gateway.front.admission).

Invariants:
- every error is OpenAI's JSON error body: 400 for bad input (the field named), 401 for a
  missing or unknown API key, 404 for an unknown model or route, 429 (with Retry-After) when the
  gateway holds its maximum of requests or a replica the request needs is at its bound, 503 when
  the frontend is unavailable, 500 only for bugs. Errors before the first token keep their
  status; once a stream has started they arrive as an SSE error event.
- a generation never outlives its client: the handler polls the connection while it waits, and
  when the client is gone it cancels the work, which closes the frontend's generator and so
  aborts the request. This holds whether or not the server runs with aiohttp's
  handler_cancellation.
"""
import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator

from aiohttp import web

from pdserve.gateway.front.admission import DEFAULT_MAX_PENDING_REQUESTS, Admission
from pdserve.gateway.front.api_keys import ApiKeys, UnauthenticatedError
from pdserve.gateway.front.fan_out import choice_inputs, merge
from pdserve.gateway.front.frontend import Frontend
from pdserve.gateway.front.frontend_types import OverloadedError, StreamChunk
from pdserve.gateway.front.json_body import decode_json_body
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.gateway.front.api_error import ApiError
from pdserve.gateway.front.openai_protocol import (ParsedRequest, parse_chat_request, parse_completion_request,
                                                   parse_detokenize_request, parse_tokenize_request)
from pdserve.gateway.front.openai_shaping import Shaper, create_shaper
from pdserve.gateway.front.request_ids import check_client_request_id
from pdserve.gateway.front.tool_parsers import DEFAULT_TOOL_CALL_PARSER, TOOL_CALL_PARSERS, ToolCallParser
from pdserve.protocol.errors import InvalidRequestError, PdserveError, UnavailableError
from pdserve.protocol.message_limits import MAX_MESSAGE_BYTES

logger = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.1
"""How often a waiting handler checks that its client is still connected."""

CANCEL_DEADLINE_S = 5.0
"""How long a handler waits for the frontend to close a generation whose client left."""

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client left before the answer"

REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID = web.RequestKey("request_id", str)
_CALLER = web.RequestKey("caller", str)  # the API key's fingerprint (gateway.front.api_keys)

OPEN_PATHS = frozenset({"/health", "/metrics"})
"""Routes served without an API key: probes and scrapers carry none."""

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class ClientGoneError(PdserveError):
    """The client closed the connection before its answer was complete."""


class IncompleteStreamError(PdserveError):
    """The frontend's stream ended without a finish reason (a frontend bug)."""


def create_app(
    frontend: Frontend, metrics: GatewayMetrics, *, max_body_bytes: int = MAX_MESSAGE_BYTES,
    api_keys: ApiKeys = ApiKeys(()), admission: Admission | None = None,
    tool_call_parser: ToolCallParser = TOOL_CALL_PARSERS[DEFAULT_TOOL_CALL_PARSER],
) -> web.Application:
    """`admission`, when shared with another front, bounds both together; by default this app
    has its own, of DEFAULT_MAX_PENDING_REQUESTS. Bodies carry whole prompts (possibly as token
    id lists), so `max_body_bytes` is far above aiohttp's 1 MiB; a larger one is a 413.
    `tool_call_parser`: the layout chat tool calls are constrained to and read in."""
    admission = admission or Admission(DEFAULT_MAX_PENDING_REQUESTS, metrics.registry, frontend.model_name)
    api = _OpenAIApi(frontend, metrics, api_keys, admission, tool_call_parser)
    app = web.Application(client_max_size=max_body_bytes, middlewares=[api.errors_and_metrics])
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    app.router.add_get("/v1/models", api.models)
    app.router.add_post("/tokenize", api.tokenize)
    app.router.add_post("/detokenize", api.detokenize)
    app.router.add_get("/health", api.health)
    app.router.add_get("/metrics", api.metrics)
    return app


class _OpenAIApi:
    def __init__(self, frontend: Frontend, metrics: GatewayMetrics, api_keys: ApiKeys, admission: Admission,
                 tool_call_parser: ToolCallParser) -> None:
        self._frontend = frontend
        self._metrics = metrics
        self._api_keys = api_keys
        self._admission = admission
        self._tool_call_parser = tool_call_parser

    @web.middleware
    async def errors_and_metrics(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            request[_REQUEST_ID] = _request_id(request)
            if request.path not in OPEN_PATHS:
                request[_CALLER] = self._api_keys.caller(request.headers.get("Authorization"))
            response = await handler(request)
        except ApiError as exc:
            response = _error_response(exc)
        except UnauthenticatedError as exc:
            response = _error_response(ApiError(401, str(exc), code="invalid_api_key"))
            response.headers["WWW-Authenticate"] = "Bearer"
        except OverloadedError as exc:
            response = _error_response(_overloaded(exc))
            response.headers["Retry-After"] = str(exc.retry_after_s)
        except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, body too large
            response = _error_response(ApiError(exc.status, exc.text or exc.reason))
        except Exception:
            logger.exception("%s %s failed", request.method, request.path)
            response = _error_response(ApiError(500, "internal server error", error_type="internal_error"))
        if _REQUEST_ID in request and not response.prepared:  # a stream sets it before it starts
            response.headers[REQUEST_ID_HEADER] = request[_REQUEST_ID]
        resource = request.match_info.route.resource
        self._metrics.on_http_response(resource.canonical if resource else "unmatched", response.status)
        return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _read_json(request)
        return await self._generate(request, parse_completion_request(body, self._frontend.model_name))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await _read_json(request)
        parsed = parse_chat_request(body, self._frontend.model_name, self._frontend.max_model_len,
                                    self._tool_call_parser)
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

    async def tokenize(self, request: web.Request) -> web.Response:
        generate_input = parse_tokenize_request(await _read_json(request), self._frontend.model_name)
        with _frontend_errors():
            token_ids = await self._frontend.prompts.encode(generate_input)
        return web.json_response({
            "count": len(token_ids),
            "max_model_len": self._frontend.max_model_len,
            "tokens": token_ids,
            "token_strs": None,
        })

    async def detokenize(self, request: web.Request) -> web.Response:
        token_ids = parse_detokenize_request(await _read_json(request), self._frontend.model_name)
        vocab_size = self._frontend.prompts.vocab_size
        if any(token_id >= vocab_size for token_id in token_ids):
            raise ApiError(400, f"tokens must be in [0, {vocab_size})", param="tokens")
        return web.json_response({"prompt": self._frontend.tokenizer.decode(token_ids)})

    async def health(self, request: web.Request) -> web.Response:
        healthy = self._frontend.health() and not self._admission.closed
        return web.json_response({"status": "ok" if healthy else "unavailable"}, status=200 if healthy else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": self._metrics.content_type})

    async def _generate(self, request: web.Request, parsed: ParsedRequest) -> web.StreamResponse:
        request_id = request[_REQUEST_ID]
        shaper = create_shaper(
            parsed, request_id, self._frontend.model_name, int(time.time()), self._frontend.tokenizer.decode)
        inputs = [dataclasses.replace(generate_input, owner=request[_CALLER])
                  for generate_input in choice_inputs(parsed.inputs, parsed.n, request_id)]
        with _frontend_errors():
            slots = self._admission.admit(len(inputs), "http")
        with slots:
            with _frontend_errors():
                chunks = merge([self._frontend.generate(generate_input) for generate_input in inputs])
            if parsed.stream:
                answer = _stream(request, chunks, len(inputs), shaper, parsed.include_usage)
            else:
                answer = _collect(chunks, len(inputs), shaper)
            try:
                return await _while_connected(request, answer)
            except ClientGoneError:
                return web.Response(status=CLIENT_CLOSED_REQUEST)


def _request_id(request: web.Request) -> str:
    """The client's X-Request-Id when it sent one (gateway.front.request_ids), else a fresh one."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None:
        return uuid.uuid4().hex
    try:
        return check_client_request_id(given, REQUEST_ID_HEADER)
    except InvalidRequestError as exc:
        raise ApiError(400, str(exc), param=REQUEST_ID_HEADER) from exc


async def _read_json(request: web.Request) -> object:
    """The JSON body; a request that declares another content type is refused, as FastAPI
    (and so vLLM) does, and one that declares none is read as JSON."""
    if "Content-Type" in request.headers and not _is_json_type(request.content_type):
        raise ApiError(
            400, f"Content-Type must be application/json, got {request.content_type!r}", param="Content-Type")
    return decode_json_body(await request.read())


def _is_json_type(content_type: str) -> bool:
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json"))


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


async def _collect(
    chunks: AsyncIterator[tuple[int, StreamChunk]], num_choices: int, shaper: Shaper
) -> web.Response:
    collected: list[list[StreamChunk]] = [[] for _ in range(num_choices)]
    async with contextlib.aclosing(chunks):
        with _frontend_errors():
            async for index, chunk in chunks:
                collected[index].append(chunk)
    if not all(choice and choice[-1].finish_reason is not None for choice in collected):
        raise IncompleteStreamError("a generation ended without a finish reason")
    return web.json_response(shaper.response(collected))


async def _stream(
    request: web.Request, chunks: AsyncIterator[tuple[int, StreamChunk]], num_choices: int, shaper: Shaper,
    include_usage: bool,
) -> web.StreamResponse:
    """SSE: one event per shaped chunk, an optional usage event, then `data: [DONE]`.

    The first chunk is awaited before the response starts (and `merge` yields it only once
    every choice has started), so a request the frontend rejects still gets its HTTP error
    status. Leaving this function closes the generator: on a finished stream that is a no-op,
    on an unfinished one it aborts the request.
    """
    async with contextlib.aclosing(chunks):
        with _frontend_errors():
            first = await anext(chunks, None)
        if first is None:
            raise IncompleteStreamError("the generation ended before its first chunk")
        response = web.StreamResponse(headers=_SSE_HEADERS | {REQUEST_ID_HEADER: request[_REQUEST_ID]})
        await _send(response.prepare(request))
        try:
            await _relay(response, first, chunks, num_choices, shaper)
            tail = [shaper.usage_event()] if include_usage else []
        except ApiError as exc:
            tail = [exc.body()]
        except OverloadedError as exc:
            tail = [_overloaded(exc).body()]
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
    response: web.StreamResponse, first: tuple[int, StreamChunk], chunks: AsyncIterator[tuple[int, StreamChunk]],
    num_choices: int, shaper: Shaper,
) -> None:
    """Writes `first` and every following chunk, checking that every choice finished."""
    finished: set[int] = set()

    async def write(index: int, chunk: StreamChunk) -> None:
        if chunk.finish_reason is not None:
            finished.add(index)
        for event in shaper.chunk_events(index, chunk):
            await _send(response.write(_sse(event)))

    await write(*first)
    with _frontend_errors():
        async for index, chunk in chunks:
            await write(index, chunk)
    if len(finished) != num_choices:
        raise IncompleteStreamError("a generation ended without a finish reason")


async def _send(write: Coroutine) -> None:
    """Awaits one write to the client; a connection error there means the client left."""
    try:
        await write
    except ConnectionError as exc:  # aiohttp's ClientConnectionResetError among them
        raise ClientGoneError("the client closed the connection mid-stream") from exc


def _sse(event: dict) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


def _overloaded(error: OverloadedError) -> ApiError:
    return ApiError(429, str(error), code="rate_limit_exceeded", error_type="rate_limit_error")


def _error_response(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status)
