"""Replicas of two KV layouts in one deployment, as during an upgrade that changes one: the
gateway sends every request to the decode replica whose layout matches the prefill replica's,
however much freer the other looks, and takes a registry entry with a field it does not know
(as a newer replica writes it); once no pair matches, a request fails at once, saying why."""
import asyncio
import signal
import time

import grpc
import pytest
import redis

from pdserve.cluster.registry_signing import SIGNATURE_FIELD, sign_entry
from pdserve.engine.config import ModelConfig
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.system.test_disaggregated import stream_all

pytestmark = pytest.mark.e2e

SAME_POOL_BYTES = 128 * 2**20  # a quarter of d-other's pool (tests.helpers), whose int8 entries are smaller still
NEWER_ENTRY_TTL_S = 300.0
REFUSAL_TIMEOUT_S = 10.0


def newer_entry(entry: dict, replica_id: str) -> dict:
    """`entry` re-announced under `replica_id` by a newer replica: a field this gateway does not
    know, and a long TTL so that nothing needs to beat for it."""
    fields = {name: value for name, value in entry.items() if name != SIGNATURE_FIELD}
    return {**fields, "replica_id": replica_id, "written_unix_s": time.time(), "ttl_s": NEWER_ENTRY_TTL_S,
            "kv_pool_tier": "host-dram"}


def test_a_decode_replica_of_another_kv_layout_gets_no_request(make_cluster, e2e_model, hf_greedy):
    cluster = make_cluster([
        ("prefill", "p0", ()),
        ("decode", "d-same", ("--kv-cache-memory", str(SAME_POOL_BYTES))),
        ("decode", "d-other", ("--kv-cache-dtype", "int8")),
        ("gateway", "gw", ("--prefill-placement", "remote")),
    ])
    entries = {**cluster.replicas("prefill"), **cluster.replicas("decode")}
    assert entries["d-same"]["kv_layout_fingerprint"] == entries["p0"]["kv_layout_fingerprint"] != ""
    assert entries["d-other"]["kv_layout_fingerprint"] != entries["p0"]["kv_layout_fingerprint"]
    # By load alone the router would pick d-other every time.
    assert entries["d-other"]["free_blocks"] > entries["d-same"]["free_blocks"]

    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True, socket_timeout=5)
    newer = newer_entry(entries["d-same"], "d-newer")  # served by d-same's process, at its endpoint
    client.set("replica:decode:d-newer", sign_entry(newer, cluster.internal_secret.encode()),
               px=round(NEWER_ENTRY_TTL_S * 1000))
    client.zadd("replicas:decode", {"d-newer": time.time() + NEWER_ENTRY_TTL_S})

    vocab_size = ModelConfig.from_dir(e2e_model).vocab_size
    cases = [([(7 * i + j) % vocab_size for j in range(5 + 9 * i)], 4 + i % 3) for i in range(8)]
    results = asyncio.run(stream_all(cluster.gateway.endpoint, cases))
    assert [token_ids for token_ids, _, _ in results] == hf_greedy(e2e_model, cases)
    served_by = [info.decode_replica for _, _, info in results]  # the gateway's record of each request
    assert set(served_by) <= {"d-same", "d-newer"} and "d-newer" in served_by, served_by
    cluster.assert_all_kv_free()

    # Only d-other left: no pair matches, and a request is refused at once rather than left to wait.
    client.delete("replica:decode:d-newer")
    client.zrem("replicas:decode", "d-newer")
    client.close()
    d_same = next(service for service in cluster.services if service.name == "d-same")
    d_same.process.send_signal(signal.SIGTERM)  # drains: it leaves the registry at once
    d_same.process.wait(timeout=30)
    assert list(cluster.replicas("decode")) == ["d-other"]
    started_s = time.monotonic()
    status, message = asyncio.run(refused(cluster.gateway.endpoint, cases[0][0]))
    assert time.monotonic() - started_s < REFUSAL_TIMEOUT_S
    assert status == grpc.StatusCode.UNAVAILABLE
    assert "shares a KV layout" in message and "d-other" in message, message


async def refused(endpoint: str, prompt: list[int]) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        request = gateway_pb2.GenerateRequest(
            prompt_token_ids=gateway_pb2.TokenIds(ids=prompt),
            params=common_pb2.SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
        try:
            async for _ in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=2 * REFUSAL_TIMEOUT_S):
                pass
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
    raise AssertionError("the request was served with no pair of matching KV layouts live")
