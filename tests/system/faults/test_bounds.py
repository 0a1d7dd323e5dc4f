"""Bounds, through the gateway:

- a decode replica's waiting queue (`--max-waiting-requests`): with one request running
  (`--max-num-seqs 1`) and one waiting, a prompt the gateway places on that replica is refused
  there, and the client hears it as the gateway's own admission bound says it (gRPC
  RESOURCE_EXHAUSTED with a `retry-after` trailer, HTTP 429 with Retry-After and a JSON body);
  the waiting request then runs once the running one ends, and no KV block stays taken;
- the largest request (`--max-request-bytes`), one limit for an HTTP body (413) and a gRPC
  message (RESOURCE_EXHAUSTED)."""
import asyncio

import grpc
import pytest

from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.system.faults.front_clients import completion_body, greedy_request, http, wait_until

pytestmark = pytest.mark.faults

MAX_REQUEST_BYTES = 64 * 2**10
RUNNING_TOKENS = 1500  # still running while the others arrive
WAITING_TOKENS = 4
PROMPTS = [[3, 14, 15, 92], [65, 35, 89], [79, 32, 38, 46, 26]]


@pytest.fixture(scope="module")
def cluster(make_cluster):
    # Local placement: every prompt goes to d0's own queue. A loose TTFT target keeps the
    # gateway's line from holding the prompts back: the replica's bound is what refuses them.
    return make_cluster([("decode", "d0", ("--max-num-seqs", "1", "--max-waiting-requests", "1")),
                         ("prefill", "p0", ()),
                         ("gateway", "gw", ("--prefill-placement", "local", "--ttft-slo-s", "600",
                                            "--max-request-bytes", str(MAX_REQUEST_BYTES)))])


def test_a_prompt_past_a_decode_replicas_waiting_bound_is_refused_on_both_fronts(cluster):
    gateway = cluster.gateway

    async def scenario():
        async with grpc.aio.insecure_channel(gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            running = stub.Generate(greedy_request("running", PROMPTS[0], RUNNING_TOKENS), timeout=300)
            await running.read()  # d0 runs it: its one sequence
            waiting = stub.Generate(greedy_request("waiting", PROMPTS[1], WAITING_TOKENS), timeout=300)
            await asyncio.to_thread(wait_until, lambda: cluster.replicas("decode")["d0"]["waiting_seqs"] == 1,
                                    "d0 to report the second request waiting", 30.0)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in stub.Generate(greedy_request("refused", PROMPTS[2], WAITING_TOKENS), timeout=60):
                    pass
            answer = await asyncio.to_thread(
                http, f"http://127.0.0.1:{gateway.http_port}/v1/completions", completion_body(PROMPTS[2], 4))
            still_running = not running.done()
            running.cancel()
            waited = [chunk async for chunk in waiting]
            return refused.value, answer, still_running, waited

    refused, answer, still_running, waited = asyncio.run(scenario())
    assert still_running  # the refusals met a full queue, not one that had moved on
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
    assert refused.details().startswith("d0: ") and "--max-waiting-requests" in refused.details()
    assert ("retry-after", "1") in tuple(refused.trailing_metadata())
    assert answer.status == 429, answer
    assert answer.headers["Retry-After"] == "1"
    assert answer.json()["error"]["code"] == "rate_limit_exceeded"
    assert sum(len(chunk.token_ids) for chunk in waited) == WAITING_TOKENS
    assert waited[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    cluster.assert_all_kv_free()


def test_a_request_past_max_request_bytes_is_refused_by_both_fronts_and_one_within_served(cluster):
    gateway = cluster.gateway
    url = f"http://127.0.0.1:{gateway.http_port}/v1/completions"
    too_long = "a" * MAX_REQUEST_BYTES
    answer = http(url, {"model": "model0", "prompt": too_long, "max_tokens": 1})
    assert answer.status == 413, answer
    assert answer.headers["Content-Type"].startswith("application/json")

    async def generate(prompt: str) -> list[gateway_pb2.GenerateChunk]:
        async with grpc.aio.insecure_channel(gateway.endpoint) as channel:
            request = gateway_pb2.GenerateRequest(prompt=prompt, params=common_pb2.SamplingParams(max_tokens=2))
            return [chunk async for chunk in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=60)]

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(generate(too_long))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert asyncio.run(generate("a short prompt"))[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert http(url, completion_body(PROMPTS[0], 2)).status == 200
