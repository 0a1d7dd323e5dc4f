"""DisaggregatedRequest against in-memory replica clients: the states it records, when it calls
decode at all, that every way of ending gives the reservation back, and how a request moves off
a replica that went away."""
import asyncio
import contextlib
from dataclasses import dataclass, field

import grpc
import pytest

from pdserve.cluster.redis_client import StateStoreUnavailableError
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.gateway.disaggregated.backend_errors import BackendError, KVTransferError
from pdserve.gateway.disaggregated.completion_text import CompletionText, SampledToken
from pdserve.gateway.front.frontend_types import UnavailableError
from pdserve.gateway.disaggregated.decode_session import DecodeStep
from pdserve.gateway.disaggregated.backend_errors import SessionBrokenError
from pdserve.gateway.disaggregated.prefill_placement import PrefillLedger, PrefillTicket, Where
from pdserve.gateway.disaggregated.request import DisaggregatedRequest, Route
from pdserve.gateway.front.metrics import GatewayMetrics
from pdserve.gateway.disaggregated.migration import MigrationLimitError, Migrations
from pdserve.gateway.disaggregated.replica_clients import KVTransferDone
from pdserve.gateway.front.request_state import RequestState
from pdserve.v1 import common_pb2

S = RequestState


@dataclass
class FakeStore:
    states: list = field(default_factory=list)

    async def create(self, request_id, prompt_tokens, owner=""):
        pass

    async def transition(self, request_id, state, **fields):
        self.states.append(state)

    async def update(self, request_id, **fields):
        pass


class FakePrefill:
    """Samples `first`; or fails with `error` before it (as a replica that dies does). Its first
    `transfer_errors` fail their KV transfer, one each."""

    def __init__(self, first: SampledToken | None, replica_id: str = "p0", error: Exception | None = None,
                 transfer_errors: list[Exception] | None = None):
        self.first = first
        self.replica_id = replica_id
        self.endpoint = f"{replica_id}:1"
        self.error = error
        self.transfer_errors = list(transfer_errors or [])
        self.runs = []  # (request id, output ids) of each run
        self.aborted = False

    def run(self, request_id, prompt_ids, output_ids, params, seed, target):
        self.runs.append((request_id, output_ids))
        return self

    async def first_token(self) -> SampledToken:
        if self.error is not None:
            raise self.error
        return self.first

    async def transfer_done(self) -> KVTransferDone:
        if self.transfer_errors:
            raise self.transfer_errors.pop(0)
        return KVTransferDone("TRANSPORT_SHM", 1024, 0.01)

    def cancel(self) -> None:
        pass

    async def abort(self, request_id):
        self.aborted = True


class FakeDecode:
    """Streams `steps`, then ends the stream, or raises `error_at_end` (as an aborted replica does)."""

    def __init__(self, steps: list[DecodeStep], error_at_end: Exception | None = None, replica_id: str = "d0"):
        self.steps = steps
        self.error_at_end = error_at_end
        self.replica_id = replica_id
        self.endpoint = f"{replica_id}:1"
        self.generated = self.stream_closed = self.aborted = False
        self.reserved = []  # (request id, token ids) of each reservation
        self.first_token_ids = []  # of each generate: None when it prefills the prompt itself

    async def reserve(self, request_id, token_ids, transport):
        self.reserved.append((request_id, token_ids))
        return "target"

    async def generate(self, request_id, prompt_ids, output_ids, params, seed, first_token_id):
        self.generated = True
        self.first_token_ids.append(first_token_id)
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


def make_request(tokenizer, decode, prefill, store, migration_limit=3, metrics=None, **params) -> DisaggregatedRequest:
    """A request routed to `decode` and `prefill` (None: prefilled on decode), or, if they are
    lists, to the first of each that has not been excluded."""
    decodes, prefills = (r if isinstance(r, list) else [r] for r in (decode, prefill))
    ledger = PrefillLedger()

    async def route(request_id, token_ids, excluded_replica_ids, arrival_s):
        live_decodes = [d for d in decodes if d.replica_id not in excluded_replica_ids]
        live_prefills = [p for p in prefills if p is None or p.replica_id not in excluded_replica_ids]
        for kind, live in (("decode", live_decodes), ("prefill", live_prefills)):
            if not live:
                raise UnavailableError(f"no live {kind} replica")
        decode, prefill = live_decodes[0], live_prefills[0]
        where = Where.LOCAL if prefill is None else Where.REMOTE
        ticket = PrefillTicket(ledger, ledger.send(where, decode.replica_id, len(token_ids)), lambda: None)
        target = None if prefill is None else await decode.reserve(request_id, token_ids, common_pb2.TRANSPORT_SHM)
        return Route(decode, prefill, common_pb2.TRANSPORT_SHM, target, ticket)

    sampling = SamplingParams(**params)
    prompt_ids = tokenizer.encode("prompt", add_special_tokens=False)
    return DisaggregatedRequest("r1", prompt_ids, sampling, CompletionText(tokenizer, "r1", prompt_ids, sampling),
                                route, store, metrics or GatewayMetrics("m"), Migrations(migration_limit))


async def collect(request: DisaggregatedRequest) -> list:
    return [chunk async for chunk in request.stream()]


def test_decode_streams_until_its_finish_reason(byte_tokenizer):
    t = byte_tokenizer
    decode, prefill, store = FakeDecode(steps(token(t, "b"), token(t, "c", "length"))), FakePrefill(token(t, "a")), FakeStore()
    chunks = asyncio.run(collect(make_request(t, decode, prefill, store, max_tokens=3)))
    assert "".join(chunk.text for chunk in chunks) == "abc" and chunks[-1].finish_reason == "length"
    assert store.states == [S.PREFILLING, S.TRANSFERRING, S.DECODING, S.FINISHED]
    assert decode.stream_closed and not decode.aborted


def test_a_prompt_prefilled_on_decode_takes_its_first_token_from_the_decode_steps(byte_tokenizer):
    t = byte_tokenizer
    decode, store = FakeDecode(steps(token(t, "a"), token(t, "b"), token(t, "c", "length"))), FakeStore()
    chunks = asyncio.run(collect(make_request(t, decode, None, store, max_tokens=3)))
    assert "".join(chunk.text for chunk in chunks) == "abc" and chunks[-1].finish_reason == "length"
    assert store.states == [S.PREFILLING, S.DECODING, S.FINISHED]
    assert decode.first_token_ids == [None] and decode.reserved == []


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


def broken(replica_id: str) -> SessionBrokenError:
    return SessionBrokenError(replica_id, f"decode replica {replica_id}: session broke")


def test_a_broken_decode_session_moves_the_request_on_with_the_tokens_streamed_so_far(byte_tokenizer):
    t = byte_tokenizer
    dying = FakeDecode(steps(token(t, "b")), broken("d0"), replica_id="d0")
    survivor = FakeDecode(steps(token(t, "d", "length")), replica_id="d1")
    prefill, store = FakePrefill(token(t, "a")), FakeStore()
    request = make_request(t, [dying, survivor], prefill, store, max_tokens=4)
    chunks = asyncio.run(collect(request))
    assert "".join(chunk.text for chunk in chunks) == "abad"  # the fake prefill samples "a" again
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 4
    a, b = t.encode("a", add_special_tokens=False)[0], t.encode("b", add_special_tokens=False)[0]
    assert prefill.runs == [("r1", []), ("r1#1", [a, b])]
    assert survivor.reserved == [("r1#1", request.prompt_ids + [a, b])]
    assert store.states == [S.PREFILLING, S.TRANSFERRING, S.DECODING, S.PREFILLING, S.TRANSFERRING,
                            S.DECODING, S.FINISHED]


def test_a_prefill_replica_that_goes_away_is_retried_on_another_and_its_reservation_released(byte_tokenizer):
    t = byte_tokenizer
    dead = FakePrefill(None, "p0", BackendError(grpc.StatusCode.UNAVAILABLE, "p0: socket closed", "p0"))
    live = FakePrefill(token(t, "a", "length"), "p1")
    decode, store = FakeDecode([]), FakeStore()
    chunks = asyncio.run(collect(make_request(t, decode, [dead, live], store, max_tokens=1)))
    assert [(chunk.text, chunk.finish_reason) for chunk in chunks] == [("a", "length")]
    assert [request_id for request_id, _ in decode.reserved] == ["r1", "r1#1"] and decode.aborted
    assert live.runs == [("r1#1", [])]


def test_a_kv_transfer_failed_by_the_decode_replica_moves_the_request_to_another_on_the_same_prefill(byte_tokenizer):
    t = byte_tokenizer
    refusing = FakeDecode([], replica_id="d0")
    survivor = FakeDecode(steps(token(t, "b", "length")), replica_id="d1")
    failed = KVTransferError(grpc.StatusCode.UNAVAILABLE, "p0: KV push of request r1 to d0 failed: NOT_FOUND", "p0")
    prefill, store, metrics = FakePrefill(token(t, "a"), transfer_errors=[failed]), FakeStore(), GatewayMetrics("m")
    request = make_request(t, [refusing, survivor], prefill, store, max_tokens=3, metrics=metrics)
    chunks = asyncio.run(collect(request))
    assert "".join(chunk.text for chunk in chunks) == "aab"  # the fake prefill samples "a" again
    a = t.encode("a", add_special_tokens=False)[0]
    assert prefill.runs == [("r1", []), ("r1#1", [a])]  # the same prefill replica, with another decode
    assert refusing.aborted and not refusing.generated  # reachable: its reservation is given back
    assert survivor.reserved == [("r1#1", request.prompt_ids + [a])]
    assert 'reason="kv_transfer_failed"} 1.0' in metrics.render().decode()


def test_a_kv_transfer_failed_by_the_only_decode_replica_never_reads_as_no_prefill_replica(byte_tokenizer):
    t = byte_tokenizer
    failed = KVTransferError(grpc.StatusCode.UNAVAILABLE, "p0: KV push of request r1 to d0 failed", "p0")
    decode, prefill = FakeDecode([], replica_id="d0"), FakePrefill(token(t, "a"), transfer_errors=[failed] * 4)
    with pytest.raises(UnavailableError) as failure:
        asyncio.run(collect(make_request(t, decode, prefill, FakeStore())))
    assert str(failure.value) == "no live decode replica"
    assert len(prefill.runs) == 1 and decode.aborted


def test_past_the_migration_limit_the_request_fails_unavailable(byte_tokenizer):
    t = byte_tokenizer
    decodes = [FakeDecode([], broken(f"d{i}"), replica_id=f"d{i}") for i in range(3)]
    store = FakeStore()
    with pytest.raises(MigrationLimitError, match="migration limit 1") as failure:
        asyncio.run(collect(make_request(t, decodes, FakePrefill(token(t, "a")), store, migration_limit=1)))
    assert failure.value.grpc_code == grpc.StatusCode.UNAVAILABLE
    assert [d.generated for d in decodes] == [True, True, False] and store.states[-1] is S.FAILED


def test_with_no_replica_left_to_move_to_the_request_fails_unavailable(byte_tokenizer):
    t = byte_tokenizer
    decode, store = FakeDecode([], broken("d0")), FakeStore()
    with pytest.raises(UnavailableError, match="no live decode replica"):
        asyncio.run(collect(make_request(t, decode, FakePrefill(token(t, "a")), store)))
    assert store.states[-1] is S.FAILED


def test_a_failure_that_is_the_requests_own_does_not_migrate(byte_tokenizer):
    t = byte_tokenizer
    refused = BackendError(grpc.StatusCode.RESOURCE_EXHAUSTED, "d0: out of blocks", "d0")
    decodes = [FakeDecode([], refused, replica_id="d0"), FakeDecode([], replica_id="d1")]
    with pytest.raises(BackendError, match="out of blocks"):
        asyncio.run(collect(make_request(t, decodes, FakePrefill(token(t, "a")), FakeStore())))
    assert not decodes[1].generated


class SlowAbortDecode(FakeDecode):
    """A decode replica whose abort answers only when `release` is set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.abort_started, self.release = asyncio.Event(), asyncio.Event()

    async def abort(self, request_id):
        self.abort_started.set()
        await asyncio.wait_for(self.release.wait(), 10)
        self.aborted = True


def test_a_request_cancelled_again_while_its_abort_is_in_flight_still_records_aborted(byte_tokenizer):
    t = byte_tokenizer
    prefill, store = FakePrefill(token(t, "a")), FakeStore()

    async def cancel_twice():
        decode = SlowAbortDecode(steps(token(t, "b"), token(t, "c")))
        first_chunk = asyncio.Event()

        async def client():  # as the gRPC front does: it closes the stream when cancelled
            async with contextlib.aclosing(make_request(t, decode, prefill, store).stream()) as chunks:
                async for _ in chunks:
                    first_chunk.set()
                    await asyncio.sleep(10)  # the client reads no more

        task = asyncio.create_task(client())
        await asyncio.wait_for(first_chunk.wait(), 10)
        task.cancel()
        await asyncio.wait_for(decode.abort_started.wait(), 10)
        task.cancel()  # as aiohttp does while the front's own disconnect poll is cancelling
        await asyncio.sleep(0)
        assert not task.done() and store.states[-1] is not S.ABORTED
        decode.release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        return decode

    decode = asyncio.run(cancel_twice())
    assert store.states[-1] is S.ABORTED and decode.aborted and prefill.aborted


@dataclass
class UnreachableOnStore(FakeStore):
    """A store whose writes of `unreachable` states fail as a Redis that is down does."""
    unreachable: tuple = ()

    async def transition(self, request_id, state, **fields):
        if state in self.unreachable:
            raise StateStoreUnavailableError("the state store (Redis) is unreachable: refused")
        await super().transition(request_id, state, **fields)

    async def update(self, request_id, **fields):
        raise StateStoreUnavailableError("the state store (Redis) is unreachable: refused")


def test_record_writes_that_cannot_reach_redis_do_not_stop_a_streaming_request(byte_tokenizer):
    t = byte_tokenizer
    decode, prefill = FakeDecode(steps(token(t, "b"), token(t, "c", "length"))), FakePrefill(token(t, "a"))
    store = UnreachableOnStore(unreachable=(S.TRANSFERRING, S.DECODING))
    chunks = asyncio.run(collect(make_request(t, decode, prefill, store, max_tokens=3)))
    assert "".join(chunk.text for chunk in chunks) == "abc" and chunks[-1].finish_reason == "length"
    assert store.states == [S.PREFILLING, S.FINISHED]


def test_a_request_whose_record_cannot_be_created_fails_unavailable_before_any_replica_call(byte_tokenizer):
    t = byte_tokenizer

    class DownStore(FakeStore):
        async def create(self, request_id, prompt_tokens, owner=""):
            raise StateStoreUnavailableError("the state store (Redis) is unreachable: refused")

    decode, prefill, store = FakeDecode([]), FakePrefill(token(t, "a")), DownStore()
    with pytest.raises(StateStoreUnavailableError):
        asyncio.run(collect(make_request(t, decode, prefill, store)))
    assert store.states == [] and decode.reserved == [] and prefill.runs == []
