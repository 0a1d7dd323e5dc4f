"""The disaggregated system end to end: gateway, prefill and decode replicas as separate
processes, a real Redis, KV moving between processes, greedy output checked against
transformers token for token."""
import asyncio
import time

import grpc
import pytest
import torch

from pdserve.engine.config import ModelConfig
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

pytestmark = pytest.mark.e2e

NUM_REQUESTS = 16
ENDED_STATES = (gateway_pb2.REQUEST_STATE_FINISHED, gateway_pb2.REQUEST_STATE_ABORTED, gateway_pb2.REQUEST_STATE_FAILED)


def prompts_and_lengths(vocab_size: int) -> list[tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(7)
    lengths = [1, 3, 250] + torch.randint(2, 200, (NUM_REQUESTS - 3,), generator=generator).tolist()
    return [(torch.randint(0, vocab_size, (n,), generator=generator).tolist(), 3 + i % 17)
            for i, n in enumerate(lengths)]


@pytest.fixture(scope="module")
def workload(e2e_model, hf_greedy):
    """Prompts (token ids) with their max_tokens, and transformers' greedy output for each."""
    cases = prompts_and_lengths(ModelConfig.from_dir(e2e_model).vocab_size)
    return cases, hf_greedy(e2e_model, cases)


async def stream_all(endpoint: str, cases):
    """Sends every request at once, streaming; returns (token ids, last chunk, RequestInfo) each."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(prompt, max_tokens):
            request = gateway_pb2.GenerateRequest(
                prompt_token_ids=gateway_pb2.TokenIds(ids=prompt),
                params=common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
            token_ids, last = [], None
            async for chunk in stub.Generate(request, timeout=120):
                token_ids += chunk.token_ids
                last = chunk
            info = await stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=last.request_id), timeout=10)
            return token_ids, last, info

        return await asyncio.gather(*(one(p, n) for p, n in cases))


def check_matches_transformers(cluster, workload) -> list:
    cases, expected = workload
    results = asyncio.run(stream_all(cluster.gateway.endpoint, cases))
    for i, ((prompt, max_tokens), want, (got, last, _)) in enumerate(zip(cases, expected, results)):
        assert got == want, f"request {i} ({len(prompt)} prompt tokens) differs from transformers"
        assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
        assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(prompt), max_tokens)
    cluster.assert_all_kv_free()
    return [info for _, _, info in results]


@pytest.fixture(scope="module")
def shm_cluster(make_cluster):
    return make_cluster([("decode", "d0", ()), ("prefill", "p0", ()), ("gateway", "gw", ("--transport", "shm", "--prefill-placement", "remote"))])


def test_greedy_equals_transformers_over_shm(shm_cluster, workload):
    infos = check_matches_transformers(shm_cluster, workload)
    assert {info.transport for info in infos} == {common_pb2.TRANSPORT_SHM}


def test_greedy_equals_transformers_over_grpc_stream(make_cluster, workload):
    cluster = make_cluster([("decode", "d0", ()), ("prefill", "p0", ()), ("gateway", "gw", ("--transport", "grpc", "--prefill-placement", "remote"))])
    infos = check_matches_transformers(cluster, workload)
    assert {info.transport for info in infos} == {common_pb2.TRANSPORT_GRPC}


def test_two_prefill_two_decode_replicas_share_the_load_and_match(make_cluster, workload):
    cluster = make_cluster([("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()),
                            ("prefill", "p1", ()), ("gateway", "gw", ("--prefill-placement", "remote"))])
    infos = check_matches_transformers(cluster, workload)
    assert {info.prefill_replica for info in infos} == {"p0", "p1"}
    assert {info.decode_replica for info in infos} == {"d0", "d1"}
    assert {info.transport for info in infos} == {common_pb2.TRANSPORT_SHM}  # same host, CPU: chosen


def test_prompts_prefilled_on_the_decode_replica_match_and_move_no_kv(make_cluster, workload):
    cluster = make_cluster([("decode", "d0", ()), ("prefill", "p0", ()),
                            ("gateway", "gw", ("--prefill-placement", "local"))])
    infos = check_matches_transformers(cluster, workload)
    assert {(info.prefill_replica, info.decode_replica, info.local_prefill) for info in infos} == {("d0", "d0", True)}
    assert {info.kv_bytes for info in infos} == {0}
    assert {tuple(change.state for change in info.history) for info in infos} == {(
        gateway_pb2.REQUEST_STATE_QUEUED, gateway_pb2.REQUEST_STATE_PREFILLING, gateway_pb2.REQUEST_STATE_DECODING,
        gateway_pb2.REQUEST_STATE_FINISHED)}


async def replicas_used(endpoint: str, num_requests: int) -> set[tuple[str, str]]:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(i):
            request = gateway_pb2.GenerateRequest(
                request_id=f"spread-{i}", prompt="hello " * (5 + i),
                params=common_pb2.SamplingParams(max_tokens=4, temperature=0))
            async for _ in stub.Generate(request, timeout=60):
                pass
            info = await stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=f"spread-{i}"), timeout=10)
            return info.prefill_replica, info.decode_replica

        return set(await asyncio.gather(*(one(i) for i in range(num_requests))))


def test_redis_records_each_request_state_history(shm_cluster):
    async def go():
        async with grpc.aio.insecure_channel(shm_cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(
                request_id="history-1", prompt="state history",
                params=common_pb2.SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
            async for _ in stub.Generate(request, timeout=60):
                pass
            return await stub.GetRequest(gateway_pb2.GetRequestRequest(request_id="history-1"), timeout=10)

    info = asyncio.run(go())
    states = [change.state for change in info.history]
    assert states == [gateway_pb2.REQUEST_STATE_QUEUED, gateway_pb2.REQUEST_STATE_PREFILLING,
                      gateway_pb2.REQUEST_STATE_TRANSFERRING, gateway_pb2.REQUEST_STATE_DECODING,
                      gateway_pb2.REQUEST_STATE_FINISHED]
    times = [change.time_unix_s for change in info.history]
    assert times == sorted(times)
    assert info.state == gateway_pb2.REQUEST_STATE_FINISHED
    assert (info.prefill_replica, info.decode_replica, info.transport) == ("p0", "d0", common_pb2.TRANSPORT_SHM)
    assert info.completion_tokens == 5 and info.kv_bytes > 0


async def ended_infos(stub, request_ids: list[str], timeout_s: float = 15.0) -> list:
    """Each request's RequestInfo once all have ended (or at the deadline): the gateway records
    an end after the client has already gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        infos = [await stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=request_id), timeout=10)
                 for request_id in request_ids]
        if all(info.state in ENDED_STATES for info in infos) or time.monotonic() > deadline:
            return infos
        await asyncio.sleep(0.1)


def test_client_that_disconnects_mid_stream_frees_its_blocks(shm_cluster):
    async def go():
        async with grpc.aio.insecure_channel(shm_cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            calls = []
            for i in range(4):
                call = stub.Generate(gateway_pb2.GenerateRequest(
                    request_id=f"gone-{i}", prompt="a long story " * 20,
                    params=common_pb2.SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True)), timeout=120)
                calls.append(call)
            for call in calls:
                for _ in range(3):
                    await call.read()
                call.cancel()
            return await ended_infos(stub, [f"gone-{i}" for i in range(4)])

    infos = asyncio.run(go())
    shm_cluster.assert_all_kv_free()
    assert all(info.state == gateway_pb2.REQUEST_STATE_ABORTED for info in infos)


def test_abort_through_the_api_ends_the_stream_and_frees_blocks(shm_cluster):
    async def go():
        async with grpc.aio.insecure_channel(shm_cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            call = stub.Generate(gateway_pb2.GenerateRequest(
                request_id="to-abort", prompt="abort me",
                params=common_pb2.SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True)), timeout=120)
            await call.read()
            await call.read()
            response = await stub.Abort(gateway_pb2.AbortRequest(request_id="to-abort"), timeout=10)
            chunks = []
            while (chunk := await call.read()) is not grpc.aio.EOF:
                chunks.append(chunk)
            return response, chunks

    response, chunks = asyncio.run(go())
    assert response.aborted
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_ABORT
    shm_cluster.assert_all_kv_free()


def test_bad_input_is_a_clear_error_not_a_hang(shm_cluster):
    async def go(request):
        async with grpc.aio.insecure_channel(shm_cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                async for _ in stub.Generate(request, timeout=30):
                    pass
            return failure.value

    too_long = asyncio.run(go(gateway_pb2.GenerateRequest(
        prompt_token_ids=gateway_pb2.TokenIds(ids=[5] * 2000), params=common_pb2.SamplingParams(max_tokens=100))))
    assert too_long.code() == grpc.StatusCode.INVALID_ARGUMENT and "context length" in too_long.details()
    bad_temperature = asyncio.run(go(gateway_pb2.GenerateRequest(
        prompt="x", params=common_pb2.SamplingParams(temperature=-1))))
    assert bad_temperature.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in bad_temperature.details()
    out_of_vocab = asyncio.run(go(gateway_pb2.GenerateRequest(prompt_token_ids=gateway_pb2.TokenIds(ids=[10**6]))))
    assert out_of_vocab.code() == grpc.StatusCode.INVALID_ARGUMENT
    for field, params in [("presence_penalty", common_pb2.SamplingParams(presence_penalty=2.5)),
                          ("repetition_penalty", common_pb2.SamplingParams(repetition_penalty=0)),
                          ("min_tokens", common_pb2.SamplingParams(max_tokens=4, min_tokens=5)),
                          ("logit_bias", common_pb2.SamplingParams(logit_bias={3: 101})),
                          ("logit_bias", common_pb2.SamplingParams(logit_bias={10**6: 1}))]:
        refused = asyncio.run(go(gateway_pb2.GenerateRequest(prompt="x", params=params)))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and field in refused.details()
    shm_cluster.assert_all_kv_free()


def test_min_tokens_holds_off_a_forced_stop_token_across_prefill_and_decode(shm_cluster):
    async def go():
        async with grpc.aio.insecure_channel(shm_cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(prompt="x", params=common_pb2.SamplingParams(
                max_tokens=12, temperature=1.0, min_tokens=5, stop_token_ids=[9], logit_bias={9: 100},
                repetition_penalty=1.5, presence_penalty=1, frequency_penalty=-1))
            return [chunk async for chunk in stub.Generate(request, timeout=60)]

    chunks = asyncio.run(go())
    token_ids = [token_id for chunk in chunks for token_id in chunk.token_ids]
    assert 9 not in token_ids[:5] and token_ids[5:] == [9]
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_STOP
    shm_cluster.assert_all_kv_free()


def test_layout_mismatch_between_prefill_and_decode_is_refused_at_once_by_the_gateway(make_cluster):
    cluster = make_cluster([("decode", "d0", ("--block-size", "32")), ("prefill", "p0", ("--block-size", "16")),
                            ("gateway", "gw", ())])

    async def go():
        async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                async for _ in stub.Generate(gateway_pb2.GenerateRequest(prompt="hello"), timeout=30):
                    pass
            return failure.value

    started_s = time.monotonic()
    error = asyncio.run(go())
    assert time.monotonic() - started_s < 10.0
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "shares a KV layout" in error.details() and "--block-size" in error.details()
    cluster.assert_all_kv_free()


def test_killed_replica_drops_out_of_routing_within_its_heartbeat_ttl(make_cluster):
    cluster = make_cluster([("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])
    victim = next(s for s in cluster.services if s.name == "d1")
    cluster.kill(victim)
    cluster.wait_until(lambda: set(cluster.replicas("decode")) == {"d0"}, "d1 to leave the registry",
                       timeout_s=3.0 + 1.5)  # heartbeat TTL plus margin
    used = asyncio.run(replicas_used(cluster.gateway.endpoint, num_requests=4))
    assert {decode for _, decode in used} == {"d0"}


def test_requests_on_a_decode_replica_that_dies_fail_promptly_with_unavailable(make_cluster):
    cluster = make_cluster([("decode", "d0", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])

    async def go():
        async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            calls = [stub.Generate(gateway_pb2.GenerateRequest(
                request_id=f"orphan-{i}", prompt="a long story " * 10,
                params=common_pb2.SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True)), timeout=120)
                for i in range(2)]
            for call in calls:
                for _ in range(3):
                    await call.read()
            cluster.kill(next(s for s in cluster.services if s.name == "d0"))
            killed_s = time.monotonic()
            codes = []
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as failure:
                    while await call.read() is not grpc.aio.EOF:
                        pass
                codes.append(failure.value.code())
            return codes, time.monotonic() - killed_s

    codes, seconds = asyncio.run(go())
    assert codes == [grpc.StatusCode.UNAVAILABLE] * 2
    assert seconds < 5.0  # the broken session fails them at once, not at a token timeout
