"""The benchmark's clients, one per backend (`bench.runner.create_client` picks one):

- "openai" (`CompletionsClient`, here): streaming `POST {base}/completions` with server-sent
  events, the OpenAI API that pdserve's HTTP front, vLLM's and llama.cpp's servers all speak;
- "grpc" (`bench.backend_grpc.GatewayClient`): the gateway's `pdserve.v1.Gateway/Generate`.

Each has `open` (connect, return the model id), `stream` (one request's `StreamPiece`s, sent
when iteration starts), `describe` (a summary of what the server recorded about the run's
requests, or None) and `close`. A client only translates; `bench.timing` owns the clock.

An OpenAI request asks for `stream_options.include_usage`, so the server's token counts arrive
in a last usage event; `ignore_eos` is vLLM's extension, which pdserve's HTTP front and
llama.cpp accept too. A prompt with token ids is sent as the id list (exact length), otherwise
as text; so does the gRPC client.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.records import StreamPiece

MODELS_TIMEOUT_S = 30.0


class BackendError(Exception):
    """The server refused or broke one request; the runner records it as that request's error."""


@dataclass(frozen=True, slots=True)
class SendOptions:
    """What every request of a run asks for besides its prompt and output length."""

    temperature: float
    ignore_eos: bool


class CompletionsClient:
    def __init__(self, base_url: str, model: str | None, options: SendOptions) -> None:
        self._base_url = base_url.rstrip("/")
        self._model = model
        self._options = options
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> str:
        """Connects; returns the model id the run uses (the first of GET /models unless given)."""
        # limit=0: the benchmark, not the connection pool, decides how many requests are in flight.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                              timeout=aiohttp.ClientTimeout(total=None))
        if self._model is None:
            self._model = await self._first_model()
        return self._model

    async def _first_model(self) -> str:
        url = f"{self._base_url}/models"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)) as response:
                if response.status != 200:
                    raise BackendError(f"GET {url}: HTTP {response.status}: {(await response.text())[:200]}")
                models = (await response.json()).get("data") or []
        except (aiohttp.ClientError, TimeoutError) as error:
            raise BackendError(f"GET {url}: {type(error).__name__}: {error}") from error
        if not models:
            raise BackendError(f"GET {url} lists no model")
        return models[0]["id"]

    async def stream(self, request: BenchRequest, request_id: str) -> AsyncIterator[StreamPiece]:
        """The pieces of one request, sent only when iteration starts."""
        body = {
            "model": self._model,
            "prompt": request.prompt_token_ids if request.prompt_token_ids is not None else request.prompt,
            "max_tokens": request.output_len,
            "temperature": self._options.temperature,
            "ignore_eos": self._options.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        url = f"{self._base_url}/completions"
        async with self._session.post(url, json=body, headers={"X-Request-Id": request_id}) as response:
            if response.status != 200:
                raise BackendError(f"HTTP {response.status}: {(await response.text())[:300]}")
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, other event fields
                data = line.removeprefix(b"data:").strip()
                if data == b"[DONE]":
                    return
                yield _piece(json.loads(data))
        raise BackendError("the event stream ended without [DONE]")

    async def describe(self, request_ids: list[str]) -> None:
        return None  # the OpenAI API has no per-request record to read back

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _piece(event: dict) -> StreamPiece:
    if "error" in event:
        raise BackendError(f"server error in stream: {event['error']}")
    choices = event.get("choices") or []
    usage = event.get("usage") or {}
    return StreamPiece(has_output=any(choice.get("text") for choice in choices),
                       prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"))
