"""The gateway's admission bound (`--max-pending-requests`): while it holds its maximum, every
further request is refused at once, on both fronts (gRPC RESOURCE_EXHAUSTED with a
`retry-after` trailer, HTTP 429 with Retry-After and a JSON body), before it writes a record to
Redis or reaches a replica; the admitted requests finish with the tokens of an unloaded run
(which starts with the offline engine's greedy output), the refusals are counted in /metrics,
and afterwards nothing is held: the gauges read 0, every KV block is free, and a new request is
admitted."""
import asyncio
import time

import grpc
import pytest
import redis

from pdserve.v1 import common_pb2, gateway_pb2_grpc
from tests.system.faults.front_clients import (
    completion_body, greedy_request, http, metric, offline_greedy, scrape, wait_until)

pytestmark = pytest.mark.faults

MAX_PENDING = 3
HELD_PROMPTS = [[3, 14, 15, 92], [65, 35, 89], [79, 32, 38, 46, 26]]
HELD_TOKENS = 800  # long enough to still run while the burst is refused
NUM_GRPC_BURST, NUM_HTTP_BURST = 6, 2
CHECKED_PREFIX_TOKENS = 32  # of each unloaded run, against the offline engine (slow on CPU)


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster([("decode", "d0", ()), ("prefill", "p0", ()),
                         ("gateway", "gw", ("--max-pending-requests", str(MAX_PENDING)))])


def stored_request_ids(cluster, pattern: str) -> list[str]:
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True, socket_timeout=5)
    try:
        return list(client.scan_iter(f"req:{pattern}"))
    finally:
        client.close()


async def unloaded_run(endpoint: str) -> list[list[int]]:
    """The held prompts' tokens with nothing else running (within the bound)."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(i: int, prompt: list[int]) -> list[int]:
            return [t async for chunk in stub.Generate(greedy_request(f"ref-{i}", prompt, HELD_TOKENS), timeout=300)
                    for t in chunk.token_ids]

        return list(await asyncio.gather(*(one(i, prompt) for i, prompt in enumerate(HELD_PROMPTS))))


def test_a_burst_past_the_bound_is_refused_on_both_fronts_and_the_admitted_finish(cluster, e2e_model):
    gateway = cluster.gateway
    base = f"http://127.0.0.1:{gateway.http_port}"
    reference = asyncio.run(unloaded_run(gateway.endpoint))
    offline = offline_greedy(e2e_model, HELD_PROMPTS, CHECKED_PREFIX_TOKENS)  # greedy: a prefix of the long run
    assert [token_ids[:CHECKED_PREFIX_TOKENS] for token_ids in reference] == [want.token_ids for want in offline]

    async def scenario():
        async with grpc.aio.insecure_channel(gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            held = [stub.Generate(greedy_request(f"held-{i}", prompt, HELD_TOKENS), timeout=300)
                    for i, prompt in enumerate(HELD_PROMPTS)]
            firsts = [await call.read() for call in held]  # each admitted and streaming

            async def refused(i: int) -> grpc.aio.AioRpcError:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    async for _ in stub.Generate(greedy_request(f"burst-{i}", HELD_PROMPTS[0], 4), timeout=30):
                        pass
                return error.value

            grpc_refusals = await asyncio.gather(*(refused(i) for i in range(NUM_GRPC_BURST)))
            http_refusals = await asyncio.gather(*(asyncio.to_thread(
                http, base + "/v1/completions", completion_body(HELD_PROMPTS[1], 4)) for _ in range(NUM_HTTP_BURST)))
            still_running = [call.done() is False for call in held]
            outputs = []
            for first, call in zip(firsts, held):
                token_ids, last = list(first.token_ids), first
                while (chunk := await call.read()) != grpc.aio.EOF:
                    token_ids += chunk.token_ids
                    last = chunk
                outputs.append((token_ids, last))
            return grpc_refusals, http_refusals, still_running, outputs

    started_s = time.monotonic()
    grpc_refusals, http_refusals, still_running, outputs = asyncio.run(scenario())
    print(f"{len(HELD_PROMPTS)} held streams of {HELD_TOKENS} tokens took {time.monotonic() - started_s:.1f} s")
    assert all(still_running)  # the burst met a full gateway, not one whose streams had ended
    for error in grpc_refusals:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert f"maximum is {MAX_PENDING}" in error.details()
        assert ("retry-after", "1") in tuple(error.trailing_metadata())
    for answer in http_refusals:
        assert answer.status == 429, answer
        assert answer.headers["Retry-After"] == "1"
        assert answer.headers["Content-Type"].startswith("application/json")
        assert answer.json()["error"]["code"] == "rate_limit_exceeded"
    for (token_ids, last), want in zip(outputs, reference):
        assert token_ids == want
        assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert stored_request_ids(cluster, "burst-*") == []  # refused before the store saw them

    def settled() -> dict[str, float] | None:
        samples = scrape(base + "/metrics")
        held = metric(samples, "pdserve:num_requests_pending") + metric(samples, "pdserve:num_requests_running")
        return samples if held == 0 else None

    samples = wait_until(settled, "the pending and running gauges to return to 0")
    assert metric(samples, "pdserve:requests_rejected_total", front="grpc") == NUM_GRPC_BURST
    assert metric(samples, "pdserve:requests_rejected_total", front="http") == NUM_HTTP_BURST
    assert metric(samples, "pdserve:http_responses_total", status_code="429") == NUM_HTTP_BURST
    cluster.assert_all_kv_free()
    after = http(base + "/v1/completions", completion_body(HELD_PROMPTS[2], 4))
    assert after.status == 200 and after.json()["usage"]["completion_tokens"] == 4
