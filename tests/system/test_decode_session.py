"""Decode.Session against real prefill and decode processes, this test playing the gateway: the
replica sends one message per engine step for all of a session's requests, an abort command or
the end of the session gives the blocks back, and one request's failure leaves the session open."""
import asyncio

import grpc
import pytest

from pdserve.engine.config import ModelConfig
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc

pytestmark = pytest.mark.e2e

READ_TIMEOUT_S = 30.0
LONG_MAX_TOKENS = 1900  # far more steps than a freed-blocks check waits for
NATURAL_FINISH_MARGIN_S = 6.0  # a check for freed blocks gives up well before long requests would end


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster([("decode", "d0", ()), ("prefill", "p0", ())])


@pytest.fixture(scope="module")
def vocab_size(e2e_model) -> int:
    return ModelConfig.from_dir(e2e_model).vocab_size


class Replicas:
    """Raw stubs of the cluster's decode and prefill replicas, and the gateway's part of a request."""

    def __init__(self, cluster):
        self.decode_channel = cluster.internal_channel(next(s for s in cluster.services if s.kind == "decode"))
        self.prefill_channel = cluster.internal_channel(next(s for s in cluster.services if s.kind == "prefill"))
        self.decode = decode_pb2_grpc.DecodeStub(self.decode_channel)
        self.prefill = prefill_pb2_grpc.PrefillStub(self.prefill_channel)

    async def land(self, request_id: str, prompt: list[int], max_tokens: int, **params) -> decode_pb2.DecodeRequest:
        """Reserves, prefills and pushes the KV; returns the generate command's request."""
        sampling = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **params)
        target = await self.decode.Reserve(decode_pb2.ReserveRequest(
            request_id=request_id, num_prompt_tokens=len(prompt), transport=common_pb2.TRANSPORT_SHM), timeout=10)
        events = [event async for event in self.prefill.Run(prefill_pb2.PrefillRequest(
            request_id=request_id, prompt_token_ids=prompt, params=sampling, seed=0, target=target), timeout=60)]
        return decode_pb2.DecodeRequest(request_id=request_id, prompt_token_ids=prompt, params=sampling, seed=0,
                                        first_token_id=events[0].first_token.token_id)

    async def close(self) -> None:
        await self.decode_channel.close()
        await self.prefill_channel.close()


class Session:
    """One Decode.Session call: commands go in through a queue, messages come out by `read`."""

    def __init__(self, stub: decode_pb2_grpc.DecodeStub):
        self._commands: asyncio.Queue = asyncio.Queue()
        self.call = stub.Session(self._command_stream())

    async def _command_stream(self):
        while True:
            yield await self._commands.get()

    def generate(self, request: decode_pb2.DecodeRequest) -> None:
        self._commands.put_nowait(decode_pb2.DecodeCommand(generate=request))

    def abort(self, request_id: str) -> None:
        self._commands.put_nowait(decode_pb2.DecodeCommand(abort_request_id=request_id))

    async def read(self) -> decode_pb2.DecodeStepOutputs:
        message = await asyncio.wait_for(self.call.read(), READ_TIMEOUT_S)
        assert message is not grpc.aio.EOF, "the session ended"
        return message

    async def read_until_ended(self, request_ids: set[str]) -> tuple[dict[str, list], list]:
        """Reads until each of `request_ids` has finished or failed; returns each one's outputs and
        every message read."""
        outputs, messages, pending = {request_id: [] for request_id in request_ids}, [], set(request_ids)
        while pending:
            message = await self.read()
            messages.append(message)
            for output in message.outputs:
                if output.request_id in outputs:
                    outputs[output.request_id].append(output)
                    if output.finish_reason or output.HasField("error"):
                        pending.discard(output.request_id)
        return outputs, messages


def prompt_of(vocab_size: int, seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % (vocab_size - 3) + 3 for i in range(length)]


def running_seqs(cluster) -> int:
    return cluster.replicas("decode")["d0"]["running_seqs"]


def test_one_message_carries_every_request_that_advanced_in_the_step(cluster, vocab_size, e2e_model, hf_greedy):
    cases = [(prompt_of(vocab_size, i, 5 + 9 * i), 24) for i in range(6)]

    async def go():
        replicas = Replicas(cluster)
        requests = await asyncio.gather(*(replicas.land(f"many-{i}", prompt, max_tokens)
                                          for i, (prompt, max_tokens) in enumerate(cases)))
        session = Session(replicas.decode)
        for request in requests:
            session.generate(request)
        outputs, messages = await session.read_until_ended({request.request_id for request in requests})
        session.call.cancel()
        await replicas.close()
        return requests, outputs, messages

    requests, outputs, messages = asyncio.run(go())
    num_tokens = sum(len(output.token_ids) for outputs_of in outputs.values() for output in outputs_of)
    assert num_tokens == sum(max_tokens - 1 for _, max_tokens in cases)
    assert len(messages) < num_tokens
    assert max(len({output.request_id for output in message.outputs}) for message in messages) > 1
    for request, want in zip(requests, hf_greedy(e2e_model, cases)):
        got = [request.first_token_id] + [t for output in outputs[request.request_id] for t in output.token_ids]
        assert got == want, f"{request.request_id} differs from transformers"
        assert outputs[request.request_id][-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    cluster.assert_all_kv_free()


def test_an_abort_command_stops_the_request_and_frees_its_blocks_while_the_session_goes_on(cluster, vocab_size):
    async def go():
        replicas = Replicas(cluster)
        kept, dropped = await asyncio.gather(
            replicas.land("kept", prompt_of(vocab_size, 1, 40), LONG_MAX_TOKENS),
            replicas.land("dropped", prompt_of(vocab_size, 2, 40), LONG_MAX_TOKENS))
        session = Session(replicas.decode)
        session.generate(kept)
        session.generate(dropped)
        seen = set()
        while seen != {"kept", "dropped"}:
            seen |= {output.request_id for output in (await session.read()).outputs}
        session.abort("dropped")
        await asyncio.to_thread(cluster.wait_until, lambda: running_seqs(cluster) == 1, "the aborted request to stop",
                                NATURAL_FINISH_MARGIN_S)
        session.abort("kept")
        await asyncio.to_thread(cluster.assert_all_kv_free, NATURAL_FINISH_MARGIN_S)
        after = await replicas.land("after", prompt_of(vocab_size, 3, 8), 6)  # the session still serves
        session.generate(after)
        outputs, _ = await session.read_until_ended({"after"})
        session.call.cancel()
        await replicas.close()
        return outputs["after"]

    after = asyncio.run(go())
    assert after[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert sum(len(output.token_ids) for output in after) == 5
    cluster.assert_all_kv_free()


def test_a_dropped_session_aborts_all_its_requests_and_frees_their_blocks(cluster, vocab_size):
    async def go():
        replicas = Replicas(cluster)
        requests = await asyncio.gather(*(replicas.land(f"dropped-{i}", prompt_of(vocab_size, 10 + i, 30),
                                                        LONG_MAX_TOKENS) for i in range(3)))
        session = Session(replicas.decode)
        for request in requests:
            session.generate(request)
        seen = set()
        while len(seen) < len(requests):
            seen |= {output.request_id for output in (await session.read()).outputs}
        session.call.cancel()
        await replicas.close()

    asyncio.run(go())
    cluster.wait_until(lambda: running_seqs(cluster) == 0, "the session's requests to stop", NATURAL_FINISH_MARGIN_S)
    cluster.assert_all_kv_free(NATURAL_FINISH_MARGIN_S)


def test_a_failed_request_leaves_the_session_open(cluster, vocab_size):
    async def go():
        replicas = Replicas(cluster)
        session = Session(replicas.decode)
        session.generate(decode_pb2.DecodeRequest(request_id="never-reserved", prompt_token_ids=[5, 6],
                                                  params=common_pb2.SamplingParams(max_tokens=4)))
        mismatched = await replicas.land("mismatched", prompt_of(vocab_size, 4, 12), 8)
        mismatched.prompt_token_ids.append(5)
        session.generate(mismatched)
        bad_params = await replicas.land("bad-params", prompt_of(vocab_size, 5, 12), 8)
        bad_params.params.temperature = -1
        session.generate(bad_params)
        good = await replicas.land("good", prompt_of(vocab_size, 6, 12), 8)
        session.generate(good)
        outputs, _ = await session.read_until_ended({"never-reserved", "mismatched", "bad-params", "good"})
        session.call.cancel()
        await replicas.close()
        return outputs

    outputs = asyncio.run(go())
    failed = {request_id: outputs[request_id][-1].error for request_id in ("never-reserved", "mismatched", "bad-params")}
    assert failed["never-reserved"].status_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert failed["mismatched"].status_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "KV of 13 tokens, 12 reserved" in failed["mismatched"].message
    assert failed["bad-params"].status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "temperature" in failed["bad-params"].message
    assert outputs["good"][-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert sum(len(output.token_ids) for output in outputs["good"]) == 7
    cluster.assert_all_kv_free()
