"""The benchmark backends, and `create_backend` that picks one (the interface they implement,
with `SendOptions` and `BackendError`, is `pdserve.bench.backend_base`).

- "pdserve-grpc": `pdserve.v1.Gateway/Generate` (`bench.backend_grpc`); after the run it asks
  `GetRequest` what the server recorded about each request (state, KV bytes, transport);
- "openai": streaming `POST /v1/completions` (`bench.backend_openai`), for pdserve's HTTP front
  and vLLM's server alike.
"""
from __future__ import annotations

from pdserve.bench.backend_base import Backend, SendOptions
from pdserve.bench.errors import BenchConfigError

BACKENDS = ("pdserve-grpc", "openai")


def create_backend(kind: str, target: str, model: str | None, options: SendOptions) -> Backend:
    # Each backend is imported only when picked: an "openai" run loads no grpc.
    if kind == "pdserve-grpc":
        from pdserve.bench.backend_grpc import GrpcGatewayBackend
        return GrpcGatewayBackend(target, options)
    if kind == "openai":
        from pdserve.bench.backend_openai import OpenAICompletionsBackend
        return OpenAICompletionsBackend(target, model, options)
    raise BenchConfigError(f"backend {kind!r} is not one of {BACKENDS}")
