"""What the benchmark learns about one request, timed by `time_stream` from the client's pieces.

As in `vllm bench serve`: the clock starts just before the request is sent; TTFT is the time to
the first piece that carries output; each later such piece adds one inter-token latency, however
many tokens it holds; E2EL ends with the stream. The output length is the server's count (its
usage event), else the pieces that carried output. A failure of any kind (the server's error, a
broken connection, the deadline) makes a failed record holding its text; it never propagates.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamPiece:  # one streamed event, as the client reads it
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


async def time_stream(pieces: AsyncIterator[StreamPiece], *, known_prompt_len: int | None, timeout_s: float,
                      start_s: float = 0.0) -> RequestRecord:
    """`pieces` is not started yet; its clock starts here. `start_s` only labels the record."""
    sent_at = time.perf_counter()
    ttft_s, last_output_at, itl_s, num_output_pieces, error = 0.0, sent_at, [], 0, ""
    prompt_tokens = completion_tokens = None
    try:
        async with asyncio.timeout(timeout_s):
            async for piece in pieces:
                now = time.perf_counter()
                if piece.prompt_tokens is not None:
                    prompt_tokens = piece.prompt_tokens
                if piece.completion_tokens is not None:
                    completion_tokens = piece.completion_tokens
                if not piece.has_output:
                    continue
                if num_output_pieces == 0:
                    ttft_s = now - sent_at
                else:
                    itl_s.append(now - last_output_at)
                last_output_at = now
                num_output_pieces += 1
    except TimeoutError:
        error = f"timed out after {timeout_s:g} s"
    except Exception as failure:  # noqa: BLE001 - any failure is this request's result
        error = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
    finally:
        with contextlib.suppress(Exception):  # closing a failed stream may fail again; the error is kept
            await pieces.aclose()
    e2el_s = time.perf_counter() - sent_at
    if not error and num_output_pieces == 0:
        error = "the stream ended without any output"
    output_len = 0 if error else completion_tokens if completion_tokens is not None else num_output_pieces
    return RequestRecord(prompt_len=prompt_tokens if prompt_tokens is not None else (known_prompt_len or 0),
                         output_len=output_len, ttft_s=ttft_s, itl_s=itl_s, e2el_s=e2el_s, success=not error,
                         error=error, start_s=start_s)
