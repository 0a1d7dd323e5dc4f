"""Clients that leave mid-stream leave nothing behind: 200 greedy streams, half through gRPC and
half through the OpenAI HTTP API (SSE), and half of all of them cut by the client at a random
(seeded) point. Afterwards every KV block is free on every replica, every request record in
Redis is terminal and has a TTL, the in-flight gauges are back to 0, and every stream that was
not cut has the tokens an uncut run gives."""
import asyncio
import random
import time
from pathlib import Path

import aiohttp
import grpc
import pytest

from pdserve.engine.config import ModelConfig
from pdserve.v1 import gateway_pb2_grpc
from tests.system.faults.conftest import assert_prefill_kv_free
from tests.system.faults.stream_clients import LIVE_STATES, grpc_stream, in_flight_gauges, request_records, sse_stream
from tests.helpers import wait_until

pytestmark = pytest.mark.faults

NUM_STREAMS = 200
NUM_PROMPTS = 10  # the streams share these, so one uncut run of each is the reference
MAX_TOKENS = 6
MAX_IN_FLIGHT = 40
SETTLE_TIMEOUT_S = 30.0


def prompts(e2e_model: str) -> list[list[int]]:
    rng = random.Random(3)
    vocab_size = ModelConfig.from_dir(e2e_model).vocab_size
    return [[rng.randrange(vocab_size) for _ in range(rng.randrange(4, 24))] for _ in range(NUM_PROMPTS)]


async def run_streams(cluster, model: str, cases: list[tuple[str, list[int], int | None]]):
    """Each case (request id, prompt, cut after) through gRPC (even index) or HTTP (odd)."""
    base_url = f"http://127.0.0.1:{cluster.gateway.http_port}"
    limit = asyncio.Semaphore(MAX_IN_FLIGHT)
    async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel, aiohttp.ClientSession() as session:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(index: int, request_id: str, prompt: list[int], cut_after: int | None):
            async with limit:
                if index % 2 == 0:
                    return await grpc_stream(stub, request_id, prompt, MAX_TOKENS, cut_after)
                return await sse_stream(session, base_url, model, request_id, prompt, MAX_TOKENS, cut_after)

        return await asyncio.gather(*(one(i, *case) for i, case in enumerate(cases)))


@pytest.mark.timeout(300)
def test_cut_streams_leave_no_block_no_live_record_and_no_gauge_behind(make_cluster, e2e_model):
    cluster = make_cluster([("decode", "d0", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])
    model = Path(e2e_model).name
    shared = prompts(e2e_model)
    reference = asyncio.run(run_streams(cluster, model, [(f"ref-{i}", p, None) for i, p in enumerate(shared)]))
    assert [outcome.status for outcome in reference] == [None] * NUM_PROMPTS

    rng = random.Random(7)
    cut = set(rng.sample(range(NUM_STREAMS), NUM_STREAMS // 2))
    cases = [(f"s-{i}", shared[i % NUM_PROMPTS], rng.randrange(MAX_TOKENS) if i in cut else None)
             for i in range(NUM_STREAMS)]
    started_s = time.monotonic()
    outcomes = asyncio.run(run_streams(cluster, model, cases))
    streamed_s = time.monotonic() - started_s

    assert [(o.request_id, o.status, o.message) for o in outcomes if o.status is not None] == []
    uncut = [(i, o) for i, o in enumerate(outcomes) if not o.cut]
    for i, outcome in uncut:
        want = reference[i % NUM_PROMPTS]
        assert outcome.finish_reason in ("length", "FINISH_REASON_LENGTH"), outcome
        assert outcome.text == want.text, f"stream {i} ({outcome.front}) differs from the uncut run"
        if outcome.front == "grpc":
            assert outcome.token_ids == want.token_ids

    cluster.assert_all_kv_free(timeout_s=SETTLE_TIMEOUT_S)
    assert_prefill_kv_free(cluster, timeout_s=SETTLE_TIMEOUT_S)
    records = wait_until(lambda: (r := request_records(cluster.redis_url)) and not any(
        state in LIVE_STATES for state, _, _ in r.values()) and r, "every request record to be terminal",
        SETTLE_TIMEOUT_S)
    gauges = wait_until(lambda: (g := in_flight_gauges(cluster.gateway.http_port)) and not any(g.values()) and g,
                        "the in-flight gauges to be back to 0", SETTLE_TIMEOUT_S)
    states = [state for request_id, (state, _, _) in records.items() if request_id.startswith("s-")]
    print(f"\ncut streams: {NUM_STREAMS} streams x {MAX_TOKENS} tokens in {streamed_s:.1f} s, "
          f"{sum(o.cut for o in outcomes)} cut; records: {len(states)} "
          f"({states.count('ABORTED')} aborted, {states.count('FINISHED')} finished); gauges {gauges}")
    assert all(record_ttl_ms > 0 and history_ttl_ms > 0 for _, record_ttl_ms, history_ttl_ms in records.values())
    assert all(records[f"s-{i}"][0] == "FINISHED" for i, _ in uncut)
    assert states.count("ABORTED") >= NUM_STREAMS // 4  # the cuts really were mid-stream
