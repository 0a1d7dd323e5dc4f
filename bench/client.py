"""The benchmark's clients, one per backend: "openai" (`CompletionsClient`, here: streaming
`POST {base}/completions`, which pdserve's HTTP front, vLLM's and llama.cpp's servers all speak)
and "grpc" (`bench.backend_grpc.GatewayClient`: the gateway's `pdserve.v1.Gateway/Generate`).

Each has `open` (connect, return the model id), `stream` (one request's `StreamPiece`s, sent
when iteration starts), `describe` (what the server recorded about the requests, or None) and
`close`; `bench.records` owns the clock. Prompts go as token ids where given (exact length), every
request greedy and generating all its output tokens (`ignore_eos`, vLLM's extension, which pdserve
and llama.cpp accept too); `stream_options.include_usage` brings the token counts in a last event.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.records import StreamPiece

MODELS_TIMEOUT_S = 30.0


class BackendError(Exception):
    """The server refused or broke one request; the runner records it as that request's error."""


class CompletionsClient:
    def __init__(self, base_url: str, model: str | None) -> None:
        self._base_url, self._model = base_url.rstrip("/"), model
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> str:
        # limit=0: the benchmark, not the connection pool, decides how many requests are in flight.
        # force_close: a connection a request each, as vLLM's benchmark opens. A kept-alive one can
        # be closed by the server as the next request is written to it (llama.cpp's server closes
        # a connection after a few requests), failing a request the server never saw.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                              timeout=aiohttp.ClientTimeout(total=None))
        if self._model is None:
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
            self._model = models[0]["id"]
        return self._model

    async def stream(self, request: BenchRequest, request_id: str) -> AsyncIterator[StreamPiece]:
        body = {"model": self._model, "prompt": request.prompt_token_ids or request.prompt,
                "max_tokens": request.output_len, "temperature": 0.0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with self._session.post(f"{self._base_url}/completions", json=body,
                                      headers={"X-Request-Id": request_id}) as response:
            if response.status != 200:
                raise BackendError(f"HTTP {response.status}: {(await response.text())[:300]}")
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, other event fields
                data = line.removeprefix(b"data:").strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise BackendError(f"server error in stream: {event['error']}")
                usage = event.get("usage") or {}
                yield StreamPiece(has_output=any(choice.get("text") for choice in event.get("choices") or []),
                                  prompt_tokens=usage.get("prompt_tokens"),
                                  completion_tokens=usage.get("completion_tokens"))
        raise BackendError("the event stream ended without [DONE]")

    async def describe(self, request_ids: list[str]) -> None:
        return None  # the OpenAI API has no per-request record to read back

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
