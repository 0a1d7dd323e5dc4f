"""DecodeClient against a scripted Decode servicer on loopback: one session carries all the
client's requests, its messages are split per request, a request's error fails only that
request, a broken session fails every request on it with SessionBrokenError, and leaving a
request early or waiting too long sends its abort command."""
import asyncio

import grpc
import pytest

from pdserve.protocol.errors import InvalidRequestError
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.gateway.disaggregated.backend_errors import BackendError, ReplicaStalledError, SessionBrokenError
from pdserve.gateway.disaggregated.replica_clients import DecodeClient, Timeouts
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc

DEADLINE_S = 5.0
Output = decode_pb2.DecodeRequestOutput


class ScriptedDecode(decode_pb2_grpc.DecodeServicer):
    """Records every command; each session sends what the test puts in `outbox` (a message, or a
    status code to end the session with)."""

    def __init__(self):
        self.commands: list[decode_pb2.DecodeCommand] = []
        self.num_sessions = 0
        self.outbox: asyncio.Queue = asyncio.Queue()

    async def Session(self, commands, context):
        self.num_sessions += 1

        async def record():
            async for command in commands:
                self.commands.append(command)

        reader = asyncio.create_task(record())
        try:
            while True:
                item = await self.outbox.get()
                if item == grpc.StatusCode.OK:
                    return
                if isinstance(item, grpc.StatusCode):
                    await context.abort(item, "scripted end")
                yield item
        finally:
            reader.cancel()

    def generated(self) -> set[str]:
        return {c.generate.request_id for c in self.commands if c.WhichOneof("command") == "generate"}

    def aborted(self) -> set[str]:
        return {c.abort_request_id for c in self.commands if c.WhichOneof("command") == "abort_request_id"}


async def until(condition, what: str) -> None:
    async def poll():
        while not condition():
            await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(poll(), DEADLINE_S)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def with_client(test, timeouts: Timeouts = Timeouts()):
    """Runs `test(servicer, client)` with a DecodeClient connected to a ScriptedDecode."""
    async def go():
        server = grpc.aio.server()
        servicer = ScriptedDecode()
        decode_pb2_grpc.add_DecodeServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        client = DecodeClient("d0", "d0:1", channel, timeouts)
        try:
            return await asyncio.wait_for(test(servicer, client), DEADLINE_S * 2)
        finally:
            client.close()
            await channel.close()
            await server.stop(None)
    return asyncio.run(go())


def generate(client: DecodeClient, request_id: str):
    return client.generate(request_id, [1, 2, 3], [], SamplingParams(max_tokens=8), seed=0, first_token_id=4)


async def collect(steps) -> list[int]:
    return [token.token_id async for step in steps for token in step.tokens]


def test_one_session_carries_every_request_and_its_messages_are_split_per_request():
    async def test(servicer, client):
        a, b = asyncio.create_task(collect(generate(client, "a"))), asyncio.create_task(collect(generate(client, "b")))
        await until(lambda: servicer.generated() == {"a", "b"}, "both generate commands")
        servicer.outbox.put_nowait(decode_pb2.DecodeStepOutputs(outputs=[
            Output(request_id="a", token_ids=[10]), Output(request_id="b", token_ids=[20])]))
        servicer.outbox.put_nowait(decode_pb2.DecodeStepOutputs(outputs=[
            Output(request_id="b", token_ids=[21], finish_reason=common_pb2.FINISH_REASON_LENGTH),
            Output(request_id="a", token_ids=[11, 12], finish_reason=common_pb2.FINISH_REASON_STOP)]))
        return await a, await b, servicer.num_sessions, servicer.aborted()

    a_tokens, b_tokens, num_sessions, aborted = with_client(test)
    assert (a_tokens, b_tokens) == ([10, 11, 12], [20, 21])
    assert num_sessions == 1
    assert aborted == set()  # both finished: nothing to abort


def test_a_request_error_fails_that_request_only():
    async def test(servicer, client):
        refused, bad, fine = (asyncio.create_task(collect(generate(client, rid))) for rid in ("refused", "bad", "fine"))
        await until(lambda: len(servicer.generated()) == 3, "three generate commands")
        servicer.outbox.put_nowait(decode_pb2.DecodeStepOutputs(outputs=[
            Output(request_id="refused", error=decode_pb2.DecodeRequestError(
                status_code=grpc.StatusCode.FAILED_PRECONDITION.value[0], message="KV has not landed yet")),
            Output(request_id="bad", error=decode_pb2.DecodeRequestError(
                status_code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="temperature must be >= 0"))]))
        servicer.outbox.put_nowait(decode_pb2.DecodeStepOutputs(outputs=[
            Output(request_id="fine", token_ids=[5], finish_reason=common_pb2.FINISH_REASON_LENGTH)]))
        return await asyncio.gather(refused, bad, fine, return_exceptions=True)

    refused, bad, fine = with_client(test)
    assert isinstance(refused, BackendError) and not isinstance(refused, SessionBrokenError)
    assert refused.grpc_code == grpc.StatusCode.FAILED_PRECONDITION and "not landed" in str(refused)
    assert isinstance(bad, InvalidRequestError)
    assert fine == [5]


@pytest.mark.parametrize("end", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK])
def test_a_broken_session_fails_every_request_on_it_and_the_next_request_opens_a_new_one(end):
    async def test(servicer, client):
        running = [asyncio.create_task(collect(generate(client, rid))) for rid in ("a", "b")]
        await until(lambda: servicer.generated() == {"a", "b"}, "both generate commands")
        servicer.outbox.put_nowait(end)
        failures = await asyncio.gather(*running, return_exceptions=True)
        later = asyncio.create_task(collect(generate(client, "later")))
        await until(lambda: "later" in servicer.generated(), "the next request's generate command")
        servicer.outbox.put_nowait(decode_pb2.DecodeStepOutputs(outputs=[
            Output(request_id="later", token_ids=[9], finish_reason=common_pb2.FINISH_REASON_STOP)]))
        return failures, await later, servicer.num_sessions

    failures, later, num_sessions = with_client(test)
    assert all(isinstance(failure, SessionBrokenError) for failure in failures)
    assert all(failure.grpc_code == grpc.StatusCode.UNAVAILABLE for failure in failures)
    assert later == [9] and num_sessions == 2


def test_leaving_a_request_early_sends_its_abort_command():
    async def test(servicer, client):
        steps = generate(client, "left")
        first = asyncio.create_task(anext(steps))
        await until(lambda: servicer.generated() == {"left"}, "the generate command")
        servicer.outbox.put_nowait(decode_pb2.DecodeStepOutputs(outputs=[Output(request_id="left", token_ids=[3])]))
        await first
        await steps.aclose()
        await until(lambda: servicer.aborted() == {"left"}, "the abort command")

    with_client(test)


def test_no_step_within_the_token_timeout_fails_the_request_as_a_stalled_replica_and_aborts_it():
    async def test(servicer, client):
        with pytest.raises(BackendError) as failure:
            await collect(generate(client, "stuck"))
        await until(lambda: servicer.aborted() == {"stuck"}, "the abort command")
        return failure.value

    failure = with_client(test, Timeouts(token_s=0.2))
    assert isinstance(failure, ReplicaStalledError)
    assert failure.grpc_code == grpc.StatusCode.UNAVAILABLE  # so the request migrates


def test_a_request_past_its_request_timeout_fails_with_deadline_exceeded():
    async def test(servicer, client):
        with pytest.raises(BackendError) as failure:
            await collect(generate(client, "long"))
        return failure.value

    failure = with_client(test, Timeouts(token_s=10.0, request_s=0.2))
    assert not isinstance(failure, ReplicaStalledError)
    assert failure.grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED
