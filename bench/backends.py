"""The interface every benchmark backend implements, and `create_backend` that picks one.

A backend only translates: it sends one `BenchRequest` and yields `StreamPiece`s as the server
streams; `bench.timing` owns the clock. Backends:
- "pdserve-grpc": `pdserve.v1.Gateway/Generate` (`bench.backend_grpc`); after the run it asks
  `GetRequest` what the server recorded about each request (state, KV bytes, transport);
- "openai": streaming `POST /v1/completions` (`bench.backend_openai`), for pdserve's HTTP front
  and vLLM's server alike.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.errors import BenchConfigError
from pdserve.bench.records import StreamPiece

BACKENDS = ("pdserve-grpc", "openai")


class BackendError(Exception):
    """The server refused or broke one request; the runner records it as that request's error."""


@dataclass(frozen=True, slots=True)
class SendOptions:
    """What every request of a run asks for besides its prompt and output length."""

    temperature: float
    ignore_eos: bool
    timeout_s: float


class Backend(Protocol):
    async def open(self) -> str:
        """Connects; returns the model id the run uses."""

    def stream(self, request: BenchRequest, request_id: str) -> AsyncIterator[StreamPiece]:
        """The pieces of one request, sent only when iteration starts."""

    async def describe(self, request_ids: list[str]) -> dict[str, dict]:
        """What the server recorded about these requests, by id ({} if it cannot say)."""

    async def close(self) -> None: ...


def create_backend(kind: str, target: str, model: str | None, options: SendOptions) -> Backend:
    if kind == "pdserve-grpc":
        from pdserve.bench.backend_grpc import GrpcGatewayBackend
        return GrpcGatewayBackend(target, options)
    if kind == "openai":
        from pdserve.bench.backend_openai import OpenAICompletionsBackend
        return OpenAICompletionsBackend(target, model, options)
    raise BenchConfigError(f"backend {kind!r} is not one of {BACKENDS}")
