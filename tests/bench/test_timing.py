"""Timing one stream (with in-memory streams): which pieces count, where the output length
comes from, and that failures and deadlines become failed records instead of errors."""
import asyncio

from pdserve.bench.records import StreamPiece
from pdserve.bench.records import time_stream


async def stream(*pieces, pause_s=0.01, fail=None):
    for piece in pieces:
        await asyncio.sleep(pause_s)
        yield piece
    if fail is not None:
        raise fail


def timed(pieces, **kwargs):
    return asyncio.run(time_stream(pieces, known_prompt_len=kwargs.pop("known_prompt_len", 7),
                                   timeout_s=kwargs.pop("timeout_s", 5.0), **kwargs))


OUT = StreamPiece(has_output=True)
EMPTY = StreamPiece(has_output=False)


def test_pieces_without_output_do_not_count_and_usage_sets_the_lengths():
    record = timed(stream(EMPTY, OUT, EMPTY, OUT, OUT,
                          StreamPiece(has_output=False, prompt_tokens=11, completion_tokens=3)))
    assert record.success and record.error == ""
    assert (record.prompt_len, record.output_len) == (11, 3)
    assert record.ttft_s >= 0.02  # two pauses before the first output
    assert len(record.itl_s) == 2 and all(gap_s >= 0.01 for gap_s in record.itl_s)
    assert record.e2el_s >= record.ttft_s + sum(record.itl_s)


def test_without_usage_output_pieces_are_counted_and_the_prompt_is_the_known_length():
    without = timed(stream(OUT, OUT, OUT))
    assert (without.output_len, without.prompt_len) == (3, 7)


def test_a_failing_stream_is_a_failed_record():
    record = timed(stream(OUT, fail=ConnectionResetError("peer went away")))
    assert not record.success and record.output_len == 0
    assert record.error == "ConnectionResetError: peer went away"
    assert record.ttft_s > 0  # what was measured before the failure is kept


def test_the_deadline_ends_a_stream_that_would_hang():
    record = timed(stream(OUT, OUT, pause_s=10.0), timeout_s=0.05)
    assert not record.success and record.error == "timed out after 0.05 s"
    assert record.e2el_s < 5.0


def test_a_stream_without_output_is_a_failure():
    record = timed(stream(EMPTY))
    assert not record.success and "without any output" in record.error
