"""What the benchmark learns about one request, and the pieces a backend streams to build it.

Timing follows `vllm bench serve`: the clock starts just before the request is sent; TTFT is
the time to the first piece that carries output; each later piece carrying output adds one
inter-token latency (the gap since the previous such piece, however many tokens it holds); E2EL
ends when the stream ends. The output length is the server's count (usage, or token ids in the
chunks), falling back to the number of pieces that carried output.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StreamPiece:
    """One streamed message, as a backend reads it."""

    has_output: bool                     # carries generated text or token ids
    num_tokens: int | None = None        # token ids it carries, when the protocol says
    prompt_tokens: int | None = None     # usage, when this piece reports it
    completion_tokens: int | None = None
    request_id: str | None = None        # the server's id of the request, when it says


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
    request_id: str = ""
    server: dict = field(default_factory=dict)  # what the server reports about it afterwards
