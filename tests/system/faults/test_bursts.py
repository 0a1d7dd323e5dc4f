"""Bursts larger than the decode replica's KV pool queue in the gateway; none is refused.

Each deployment gets a decode pool that holds only a few of the burst's requests at once, and
this gateway's cap on reserved blocks (half the pool) fewer still, so a gateway that reserved
decode blocks before a prompt's prefill could start would refuse most of the burst. Every
request that its client does not cut must finish with the offline engine's greedy tokens; then
no KV block is held on any replica and every request record is terminal.

1. 32 concurrent prompts of 1,500-1,900 tokens through two prefill replicas and one decode
   replica whose pool holds about three of them; the same with one prefill replica killed
   (SIGKILL) once a quarter of them have begun, its requests moving to the other.
2. 200 streams, 64 at a time, half of them cut by their clients at a random (seeded) point.
"""
import asyncio
import random

import grpc
import pytest

from pdserve.engine.config import ModelConfig
from pdserve.v1 import gateway_pb2_grpc
from tests.helpers import wait_until
from tests.system.faults.conftest import assert_prefill_kv_free
from tests.system.faults.front_clients import offline_greedy
from tests.system.faults.stream_clients import LIVE_STATES, grpc_stream, request_records

pytestmark = pytest.mark.faults

SETTLE_TIMEOUT_S = 30.0
LONG_MAX_TOKENS = 16


def random_prompts(model_dir: str, seed: int, num_prompts: int, min_len: int, max_len: int) -> list[list[int]]:
    rng = random.Random(seed)
    vocab_size = ModelConfig.from_dir(model_dir).vocab_size
    return [[rng.randrange(vocab_size) for _ in range(rng.randrange(min_len, max_len + 1))]
            for _ in range(num_prompts)]


async def burst(endpoint: str, cases: list[tuple[str, list[int], int | None]], max_tokens: int, max_in_flight: int):
    """Each case (request id, prompt, cut after) as a gRPC stream, `max_in_flight` at a time."""
    limit = asyncio.Semaphore(max_in_flight)
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(request_id: str, prompt: list[int], cut_after: int | None):
            async with limit:
                return await grpc_stream(stub, request_id, prompt, max_tokens, cut_after)

        return await asyncio.gather(*(one(*case) for case in cases))


def assert_nothing_left(cluster, request_ids: list[str]) -> dict[str, tuple[str, int, int]]:
    cluster.assert_all_kv_free(timeout_s=SETTLE_TIMEOUT_S)
    assert_prefill_kv_free(cluster, timeout_s=SETTLE_TIMEOUT_S)

    def all_terminal():  # a stream cut before it was sent has no record
        records = request_records(cluster.redis_url)
        return records if all(records[i][0] not in LIVE_STATES for i in request_ids if i in records) else None
    return wait_until(all_terminal, "every request record to be terminal", SETTLE_TIMEOUT_S)


@pytest.fixture(scope="module")
def long_burst(make_cluster, e2e_model):
    """One deployment for the long prompts: its decode pool's 360 blocks of 16 tokens hold three
    requests of ~1,700 tokens and the gateway may reserve 180; the prompts and their greedy
    tokens."""
    prompts = random_prompts(e2e_model, seed=11, num_prompts=32, min_len=1500, max_len=1900)
    cluster = make_cluster([("decode", "d0", ("--num-gpu-blocks", "360")), ("prefill", "p0", ()),
                            ("prefill", "p1", ()), ("gateway", "gw", ("--prefill-placement", "remote"))])
    return cluster, prompts, [greedy.token_ids for greedy in offline_greedy(e2e_model, prompts, LONG_MAX_TOKENS)]


def assert_long_burst_done(cluster, cases, outcomes, reference) -> None:
    assert [(o.request_id, o.status, o.message) for o in outcomes if o.status is not None] == []
    assert [i for i, o in enumerate(outcomes) if o.token_ids != reference[i]] == []
    records = assert_nothing_left(cluster, [request_id for request_id, _, _ in cases])
    assert {records[request_id][0] for request_id, _, _ in cases} == {"FINISHED"}


@pytest.mark.timeout(300)
def test_32_long_prompts_at_once_all_finish_through_a_pool_that_holds_three(long_burst):
    cluster, prompts, reference = long_burst
    cases = [(f"long-{i}", prompt, None) for i, prompt in enumerate(prompts)]
    outcomes = asyncio.run(burst(cluster.gateway.endpoint, cases, LONG_MAX_TOKENS, max_in_flight=len(cases)))
    assert_long_burst_done(cluster, cases, outcomes, reference)


@pytest.mark.timeout(300)
def test_32_long_prompts_lose_none_when_a_prefill_replica_is_killed_among_them(long_burst):
    cluster, prompts, reference = long_burst
    cases = [(f"kill-{i}", prompt, None) for i, prompt in enumerate(prompts)]

    async def burst_with_a_kill():
        running = asyncio.create_task(burst(cluster.gateway.endpoint, cases, LONG_MAX_TOKENS,
                                            max_in_flight=len(cases)))

        def begun() -> int:
            records = request_records(cluster.redis_url)
            return sum(records.get(request_id, ("QUEUED",))[0] != "QUEUED" for request_id, _, _ in cases)
        while await asyncio.to_thread(begun) < len(cases) // 4:
            assert not running.done(), "the burst ended before the kill"
            await asyncio.sleep(0.05)
        cluster.kill(next(s for s in cluster.services if s.name == "p0"))
        return await running
    outcomes = asyncio.run(asyncio.wait_for(burst_with_a_kill(), 240))
    assert_long_burst_done(cluster, cases, outcomes, reference)


@pytest.mark.timeout(300)
def test_200_streams_64_at_a_time_half_cut_all_uncut_finish(make_cluster, e2e_model):
    num_streams, num_prompts, max_tokens = 200, 20, 12
    prompts = random_prompts(e2e_model, seed=5, num_prompts=num_prompts, min_len=60, max_len=200)
    # 32 blocks of 16 tokens hold two or three requests; the gateway may reserve 16.
    cluster = make_cluster([("decode", "d0", ("--num-gpu-blocks", "32")), ("prefill", "p0", ()),
                            ("gateway", "gw", ())])
    reference = [greedy.token_ids for greedy in offline_greedy(e2e_model, prompts, max_tokens)]

    rng = random.Random(7)
    cut = set(rng.sample(range(num_streams), num_streams // 2))
    cases = [(f"b-{i}", prompts[i % num_prompts], rng.randrange(max_tokens) if i in cut else None)
             for i in range(num_streams)]
    outcomes = asyncio.run(burst(cluster.gateway.endpoint, cases, max_tokens, max_in_flight=64))

    assert [(o.request_id, o.status, o.message) for o in outcomes if o.status is not None] == []
    uncut = [i for i, outcome in enumerate(outcomes) if not outcome.cut]
    assert [i for i in uncut if outcomes[i].token_ids != reference[i % num_prompts]] == []
    records = assert_nothing_left(cluster, [request_id for request_id, _, _ in cases])
    assert {records[f"b-{i}"][0] for i in uncut} == {"FINISHED"}
