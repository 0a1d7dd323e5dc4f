"""DisaggregatedRequest against in-memory replica clients: the states it records, when it calls
decode at all, and that every way of ending gives the reservation back."""
import asyncio
from dataclasses import dataclass, field

import grpc
import pytest

from engine.sampling_params import SamplingParams
from gateway.backend_errors import BackendError
from gateway.completion_text import CompletionText, SampledToken
from gateway.decode_session import DecodeStep
from gateway.disaggregated import DisaggregatedRequest, Route
from gateway.metrics import GatewayMetrics
from gateway.replica_clients import KVTransferDone
from gateway.request_state import RequestState
from pdserve.v1 import common_pb2

S = RequestState


@dataclass
class FakeStore:
    states: list = field(default_factory=list)

    async def transition(self, request_id, state, **fields):
        self.states.append(state)

    async def update(self, request_id, **fields):
        pass


class FakePrefill:
    replica_id = "p0"

    def __init__(self, first: SampledToken):
        self.first = first
        self.aborted = False

    def run(self, request_id, prompt_ids, params, seed, target):
        return self

    async def first_token(self) -> SampledToken:
        return self.first

    async def transfer_done(self) -> KVTransferDone:
        return KVTransferDone("TRANSPORT_SHM", 1024, 0.01)

    def cancel(self) -> None:
        pass

    async def abort(self, request_id):
        self.aborted = True


class FakeDecode:
    """Streams `steps`, then ends the stream, or raises `error_at_end` (as an aborted replica does)."""

    replica_id = "d0"

    def __init__(self, steps: list[DecodeStep], error_at_end: Exception | None = None):
        self.steps = steps
        self.error_at_end = error_at_end
        self.generated = self.stream_closed = self.aborted = False

    async def reserve(self, request_id, num_prompt_tokens, transport):
        return "target"

    async def generate(self, request_id, prompt_ids, params, seed, first_token_id):
        self.generated = True
        try:
            for step in self.steps:
                yield step
            if self.error_at_end is not None:
                raise self.error_at_end
        finally:
            self.stream_closed = True

    async def abort(self, request_id):
        self.aborted = True


def token(tokenizer, char: str, finish_reason=None) -> SampledToken:
    return SampledToken(tokenizer.encode(char, add_special_tokens=False)[0], None, finish_reason)


def steps(*tokens: SampledToken) -> list[DecodeStep]:
    return [DecodeStep([t], num_preemptions=0) for t in tokens]


def make_request(tokenizer, decode, prefill, store, **params) -> DisaggregatedRequest:
    async def route(num_prompt_tokens):
        return Route(decode, prefill, common_pb2.TRANSPORT_SHM)

    sampling = SamplingParams(**params)
    prompt_ids = tokenizer.encode("prompt", add_special_tokens=False)
    return DisaggregatedRequest("r1", prompt_ids, sampling, CompletionText(tokenizer, "r1", prompt_ids, sampling),
                                route, store, GatewayMetrics("m"))


async def collect(request: DisaggregatedRequest) -> list:
    return [chunk async for chunk in request.stream()]


def test_decode_streams_until_its_finish_reason(byte_tokenizer):
    t = byte_tokenizer
    decode, prefill, store = FakeDecode(steps(token(t, "b"), token(t, "c", "length"))), FakePrefill(token(t, "a")), FakeStore()
    chunks = asyncio.run(collect(make_request(t, decode, prefill, store, max_tokens=3)))
    assert "".join(chunk.text for chunk in chunks) == "abc" and chunks[-1].finish_reason == "length"
    assert store.states == [S.PREFILLING, S.TRANSFERRING, S.DECODING, S.FINISHED]
    assert decode.stream_closed and not decode.aborted


def test_a_first_token_that_ends_the_request_skips_decode_and_releases_the_reservation(byte_tokenizer):
    t = byte_tokenizer
    decode, prefill, store = FakeDecode([]), FakePrefill(token(t, "a", "length")), FakeStore()
    chunks = asyncio.run(collect(make_request(t, decode, prefill, store, max_tokens=1)))
    assert [(chunk.text, chunk.finish_reason) for chunk in chunks] == [("a", "length")]
    assert store.states == [S.PREFILLING, S.TRANSFERRING, S.FINISHED]
    assert not decode.generated and decode.aborted


def test_a_stop_string_ends_the_request_and_closes_the_decode_stream(byte_tokenizer):
    t = byte_tokenizer
    decode = FakeDecode(steps(token(t, "b"), token(t, "c"), token(t, "d")))
    store = FakeStore()
    chunks = asyncio.run(collect(make_request(t, decode, FakePrefill(token(t, "a")), store, stop=["bc"])))
    assert "".join(chunk.text for chunk in chunks) == "a"
    assert (chunks[-1].finish_reason, chunks[-1].stop_reason) == ("stop", "bc")
    assert decode.stream_closed and store.states[-1] is S.FINISHED


def test_abort_through_the_api_ends_the_stream_with_an_abort_chunk(byte_tokenizer):
    t = byte_tokenizer
    aborted_by_replica = BackendError(grpc.StatusCode.ABORTED, "d0: aborted")
    decode, prefill, store = FakeDecode(steps(token(t, "b")), aborted_by_replica), FakePrefill(token(t, "a")), FakeStore()
    request = make_request(t, decode, prefill, store)

    async def run():
        chunks = []
        async for chunk in request.stream():
            chunks.append(chunk)
            if len(chunks) == 2:
                await request.abort()
        return chunks

    chunks = asyncio.run(run())
    assert [chunk.finish_reason for chunk in chunks] == [None, None, "abort"]
    assert store.states[-1] is S.ABORTED and decode.aborted and prefill.aborted


def test_a_decode_stream_that_ends_early_fails_the_request_and_aborts_both_replicas(byte_tokenizer):
    t = byte_tokenizer
    decode, prefill, store = FakeDecode(steps(token(t, "b"))), FakePrefill(token(t, "a")), FakeStore()
    with pytest.raises(BackendError, match="ended the stream"):
        asyncio.run(collect(make_request(t, decode, prefill, store)))
    assert store.states[-1] is S.FAILED and decode.aborted and prefill.aborted


def test_a_client_that_leaves_aborts_the_request_on_both_replicas(byte_tokenizer):
    t = byte_tokenizer
    decode, prefill, store = FakeDecode(steps(token(t, "b"), token(t, "c"))), FakePrefill(token(t, "a")), FakeStore()

    async def leave_after_one_chunk():
        chunks = make_request(t, decode, prefill, store).stream()
        await anext(chunks)
        await chunks.aclose()

    asyncio.run(leave_after_one_chunk())
    assert store.states[-1] is S.ABORTED and decode.aborted and prefill.aborted
