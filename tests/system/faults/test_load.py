"""1024 concurrent gRPC streams through one gateway on the make_cluster deployment (one prefill,
one decode replica): every stream is admitted (the default --max-pending-requests holds them
all), none fails, each gives the offline engine's greedy tokens for its prompt, and afterwards
no KV block is held and the gateway's gauges read 0. Outputs are short so that the run measures
the front's concurrency, not decoding."""
import asyncio
import time

import grpc
import pytest

from pdserve.v1 import gateway_pb2_grpc
from tests.system.faults.front_clients import greedy_request, metric, offline_greedy, scrape, wait_until
from tests.system.faults.stream_clients import request_records

pytestmark = pytest.mark.faults

NUM_STREAMS = 1024
NUM_PROMPTS = 16  # distinct prompts, cycled over the streams
MAX_TOKENS = 4
STREAM_TIMEOUT_S = 180.0


def prompt(i: int) -> list[int]:
    return [(7 * i + 3 * j) % 250 + 1 for j in range(4 + i % 12)]


@pytest.mark.timeout(600)
def test_1024_concurrent_streams_all_succeed_with_greedy_output_and_leak_nothing(make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])
    reference = [greedy.token_ids for greedy in offline_greedy(e2e_model, [prompt(i) for i in range(NUM_PROMPTS)],
                                                                MAX_TOKENS)]

    async def load() -> list[list[int] | grpc.aio.AioRpcError]:
        async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)

            async def one(i: int) -> list[int] | grpc.aio.AioRpcError:
                try:
                    return [token_id async for chunk in stub.Generate(
                        greedy_request(f"load-{i}", prompt(i % NUM_PROMPTS), MAX_TOKENS), timeout=STREAM_TIMEOUT_S)
                        for token_id in chunk.token_ids]
                except grpc.aio.AioRpcError as error:
                    return error

            return await asyncio.gather(*(one(i) for i in range(NUM_STREAMS)))

    started_s = time.monotonic()
    results = asyncio.run(load())
    wall_s = time.monotonic() - started_s
    failures = [(i, r.code(), r.details(), r.debug_error_string()) for i, r in enumerate(results)
                if isinstance(r, grpc.aio.AioRpcError)]
    print(f"\n{NUM_STREAMS} concurrent streams x {MAX_TOKENS} tokens: {wall_s:.1f} s wall, {len(failures)} failed")
    if failures:  # what the gateway made of each failed stream, for the report
        records = request_records(cluster.redis_url)
        failures = [(*failure, records.get(f"load-{failure[0]}")) for failure in failures]
    assert failures == [], cluster.gateway.log_tail()
    wrong = [i for i, tokens in enumerate(results) if tokens != reference[i % NUM_PROMPTS]]
    assert wrong == []
    cluster.assert_all_kv_free()
    base = f"http://127.0.0.1:{cluster.gateway.http_port}"

    def settled() -> dict[str, float] | None:
        samples = scrape(base + "/metrics")
        held = metric(samples, "pdserve:num_requests_pending") + metric(samples, "pdserve:num_requests_running")
        return samples if held == 0 else None

    samples = wait_until(settled, "the pending and running gauges to return to 0")
    assert metric(samples, "pdserve:requests_rejected_total") == 0
    assert metric(samples, "pdserve:request_success_total", finished_reason="length") == NUM_STREAMS
