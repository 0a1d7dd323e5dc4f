"""Times one request's stream into a `RequestRecord` (the rules are in `bench.records`).

A failure of any kind (the server's error, a broken connection, the per-request deadline) ends
the request as a failed record holding the error's text; it never propagates.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from pdserve.bench.records import RequestRecord, StreamPiece


async def time_stream(pieces: AsyncIterator[StreamPiece], *, known_prompt_len: int | None, timeout_s: float,
                      start_s: float = 0.0) -> RequestRecord:
    """`pieces` is not started yet; its clock starts here. `start_s` only labels the record."""
    sent_at = time.perf_counter()
    ttft_s, last_output_at, itl_s = 0.0, sent_at, []
    num_output_pieces = 0
    prompt_tokens = completion_tokens = None
    error = ""
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
        await _close(pieces)
    e2el_s = time.perf_counter() - sent_at
    if not error and num_output_pieces == 0:
        error = "the stream ended without any output"
    prompt_len = prompt_tokens if prompt_tokens is not None else (known_prompt_len or 0)
    if error:
        return RequestRecord(prompt_len=prompt_len, output_len=0, ttft_s=ttft_s, itl_s=itl_s, e2el_s=e2el_s,
                             success=False, error=error, start_s=start_s)
    output_len = completion_tokens if completion_tokens is not None else num_output_pieces
    return RequestRecord(prompt_len=prompt_len, output_len=output_len, ttft_s=ttft_s, itl_s=itl_s,
                         e2el_s=e2el_s, success=True, error="", start_s=start_s)


async def _close(pieces: AsyncIterator[StreamPiece]) -> None:
    close = getattr(pieces, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001 - closing a failed stream may fail again; the record has the cause
            pass
