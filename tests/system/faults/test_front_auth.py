"""API keys on the gateway's two fronts: a call with no key or a wrong one is refused (gRPC
UNAUTHENTICATED, HTTP 401 with OpenAI's JSON error body) before it does any work, a call with a
configured key gets the greedy output of the offline engine, /health and /metrics stay open,
and a request belongs to the caller that created it: another caller's Abort and GetRequest are
NOT_FOUND, word for word as for an id that never existed, even after Redis lost the records, when
the owner still aborts its running request. `pdserve up --api-key` hands its key to the
gateway."""
import asyncio
import json

import grpc
import pytest
import redis

from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.system.faults.front_clients import (bearer, completion_body, greedy_request, http, offline_greedy, scrape,
                                        wait_until)
from tests.system.faults.up_deployment import start_up, stop_up

pytestmark = pytest.mark.faults

KEY_A, KEY_B = "key-of-caller-a", "key-of-caller-b"
PROMPTS = [[5, 17, 42, 99, 3], [250, 7, 7, 1]]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster([("decode", "d0", ()), ("prefill", "p0", ()),
                         ("gateway", "gw", ("--api-key", KEY_A, "--api-key", KEY_B))])


@pytest.fixture(scope="module")
def reference(e2e_model):
    return offline_greedy(e2e_model, PROMPTS, MAX_TOKENS)


def stored_request_ids(cluster, pattern: str) -> list[str]:
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True, socket_timeout=5)
    try:
        return [key for key in client.scan_iter(f"req:{pattern}")]
    finally:
        client.close()


async def generate(endpoint: str, request: gateway_pb2.GenerateRequest, key: str | None) -> list[int]:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        token_ids = []
        async for chunk in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=120, metadata=bearer(key)):
            token_ids += chunk.token_ids
        return token_ids


def test_grpc_refuses_a_missing_or_wrong_key_and_serves_each_configured_one(cluster, reference):
    endpoint = cluster.gateway.endpoint
    for key in (None, "not-a-key", KEY_A + "x"):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            asyncio.run(generate(endpoint, greedy_request(f"refused-{key}", PROMPTS[0], MAX_TOKENS), key))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, key
        assert "API key" in refused.value.details()
    with grpc.insecure_channel(endpoint) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            gateway_pb2_grpc.GatewayStub(channel).ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    for key, prompt, want in zip((KEY_A, KEY_B), PROMPTS, reference):
        served = asyncio.run(generate(endpoint, greedy_request(f"served-{key}", prompt, MAX_TOKENS), key))
        assert served == want.token_ids
    assert stored_request_ids(cluster, "refused-*") == []  # refused before any record was written
    cluster.assert_all_kv_free()


def test_http_refuses_a_missing_or_wrong_key_with_a_401_json_body_and_serves_the_right_one(cluster, reference):
    base = f"http://127.0.0.1:{cluster.gateway.http_port}"
    for path, body in (("/v1/completions", completion_body(PROMPTS[0], MAX_TOKENS)), ("/v1/models", None)):
        for key in (None, "not-a-key"):
            answer = http(base + path, body, key=key)
            assert answer.status == 401, (path, key, answer)
            assert answer.headers["Content-Type"].startswith("application/json")
            assert answer.headers["WWW-Authenticate"] == "Bearer"
            error = answer.json()["error"]
            assert error["code"] == "invalid_api_key" and "API key" in error["message"]
    for stream in (False, True):
        answer = http(base + "/v1/completions", completion_body(PROMPTS[1], MAX_TOKENS, stream=stream), key=KEY_B)
        assert answer.status == 200, answer
        if stream:
            events = [line[len("data: "):] for line in answer.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            text = "".join(choice["text"] for event in events[:-1] for choice in json.loads(event)["choices"])
        else:
            text = answer.json()["choices"][0]["text"]
        assert text == reference[1].text
    # Open without a key; its readiness is refreshed from the registry every second, so a
    # replica-list read that missed under load can make it 503 for a moment, never 401.
    wait_until(lambda: http(base + "/health").status == 200, "/health to answer 200 without a key")
    samples = scrape(base + "/metrics")
    assert any(name.startswith("pdserve:http_responses_total") and 'status_code="401"' in name for name in samples)


def test_another_callers_abort_and_lookup_are_not_found_while_the_owners_work(cluster):
    endpoint = cluster.gateway.endpoint

    async def scenario():
        async with grpc.aio.insecure_channel(endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            stream = stub.Generate(greedy_request("owned-by-a", PROMPTS[0], 1500), timeout=120, metadata=bearer(KEY_A))
            first = await stream.read()  # running now, with its record in Redis
            assert first.request_id == "owned-by-a"

            async def refusal(call) -> tuple[grpc.StatusCode, str]:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                return refused.value.code(), refused.value.details()

            def lookup(request_id, key):
                return stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=request_id), timeout=10,
                                       metadata=bearer(key))

            def abort(request_id, key):
                return stub.Abort(gateway_pb2.AbortRequest(request_id=request_id), timeout=10, metadata=bearer(key))

            unknown_lookup = await refusal(lookup("owned-by-a-not", KEY_B))
            unknown_abort = await refusal(abort("owned-by-a-not", KEY_B))
            others_lookup = await refusal(lookup("owned-by-a", KEY_B))
            others_abort = await refusal(abort("owned-by-a", KEY_B))
            own_info = await lookup("owned-by-a", KEY_A)
            own_abort = await abort("owned-by-a", KEY_A)
            rest = []
            while (chunk := await stream.read()) != grpc.aio.EOF:
                rest.append(chunk)
            return unknown_lookup, unknown_abort, others_lookup, others_abort, own_info, own_abort, rest

    unknown_lookup, unknown_abort, others_lookup, others_abort, own_info, own_abort, rest = asyncio.run(scenario())
    for others, unknown in ((others_lookup, unknown_lookup), (others_abort, unknown_abort)):
        assert others[0] == unknown[0] == grpc.StatusCode.NOT_FOUND
        assert others[1] == unknown[1].replace("owned-by-a-not", "owned-by-a")  # nothing tells them apart
    assert own_info.request_id == "owned-by-a" and own_info.decode_replica == "d0"
    assert own_abort.aborted
    assert rest[-1].finish_reason == common_pb2.FINISH_REASON_ABORT  # B's abort did not end it; A's did
    assert 1 + sum(len(chunk.token_ids) for chunk in rest) < 1500
    cluster.assert_all_kv_free()


def test_after_redis_lost_its_data_the_owner_still_aborts_its_running_request_and_no_one_else_can(cluster):
    endpoint = cluster.gateway.endpoint

    async def scenario():
        async with grpc.aio.insecure_channel(endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            stream = stub.Generate(greedy_request("kept-by-a", PROMPTS[0], 1500), timeout=120, metadata=bearer(KEY_A))
            await stream.read()  # running now, with its record in Redis
            client = redis.Redis.from_url(cluster.redis_url, socket_timeout=5)
            try:
                client.flushdb()  # as a Redis restarted empty: every record gone
            finally:
                client.close()

            def abort(request_id, key):
                return stub.Abort(gateway_pb2.AbortRequest(request_id=request_id), timeout=10, metadata=bearer(key))

            refusals = []
            for request_id in ("kept-by-a", "kept-by-a-not"):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await abort(request_id, KEY_B)
                refusals.append((refused.value.code(), refused.value.details()))
            own_abort = await abort("kept-by-a", KEY_A)
            rest = []
            while (chunk := await stream.read()) != grpc.aio.EOF:
                rest.append(chunk)
            return refusals, own_abort, rest

    (others, unknown), own_abort, rest = asyncio.run(scenario())
    assert others[0] == unknown[0] == grpc.StatusCode.NOT_FOUND
    assert others[1] == unknown[1].replace("kept-by-a-not", "kept-by-a")
    assert own_abort.aborted
    assert rest[-1].finish_reason == common_pb2.FINISH_REASON_ABORT
    assert 1 + sum(len(chunk.token_ids) for chunk in rest) < 1500
    cluster.assert_all_kv_free()  # once the replicas' heartbeats have listed them again


@pytest.mark.timeout(420)
def test_up_passes_its_api_key_to_the_gateway_and_comes_up_through_it(e2e_model, reference, tmp_path):
    up = start_up(tmp_path, e2e_model, "--api-key", KEY_A)  # up's own ListModels call presents the key
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            asyncio.run(generate(up.gateway, greedy_request("up-refused", PROMPTS[0], MAX_TOKENS), None))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        tokens = asyncio.run(generate(up.gateway, greedy_request("up-served", PROMPTS[0], MAX_TOKENS), KEY_A))
        assert tokens == reference[0].token_ids
    finally:
        stop_up(up)
