"""What the benchmark learns about one request, and the pieces the client streams to build it.

Timing follows `vllm bench serve`: the clock starts just before the request is sent; TTFT is
the time to the first piece that carries output; each later piece carrying output adds one
inter-token latency (the gap since the previous such piece, however many tokens it holds); E2EL
ends when the stream ends. The output length is the server's count (its usage event), falling
back to the number of pieces that carried output.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamPiece:
    """One streamed event, as the client reads it."""

    has_output: bool                     # carries generated text
    prompt_tokens: int | None = None     # usage, when this piece reports it
    completion_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    prompt_len: int
    output_len: int          # 0 when the request failed
    ttft_s: float            # 0.0 when no output arrived
    itl_s: list[float]
    e2el_s: float
    success: bool
    error: str               # "" on success
    start_s: float = 0.0     # send time, from the start of the run
