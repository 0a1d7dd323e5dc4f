"""Prefix caching across replicas, end to end: two prefill replicas each hold a different long
prompt in their prefix cache, and follow-up requests that extend a prompt go to the replica
holding it; the decode replica, which holds both, receives only the blocks after the prefix.
Output equals transformers' whichever replica computes it and whatever part of it was cached,
through this gateway and through a load-only one over the same replicas; the replicas count
their hits."""
import asyncio
import time

import grpc
import pytest
import redis
import torch

from pdserve.cluster.prefix_digest import DEFAULT_REFRESH_S, decode_digest, digest_key, num_cached_blocks
from pdserve.protocol.kv_blocks import block_hashes
from pdserve.engine.config import ModelConfig
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

pytestmark = pytest.mark.e2e

BLOCK_SIZE = 16
PROMPT_TOKENS = 16 * BLOCK_SIZE
MAX_TOKENS = 4
ROUTING_TIMEOUT_S = 30.0

REMOTE = ("--prefill-placement", "remote")  # every prompt through a prefill replica: the path under test


async def generate(endpoint: str, prompt: list[int]) -> tuple[list[int], gateway_pb2.RequestInfo]:
    """Greedy tokens of one request, and its record."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(
            prompt_token_ids=gateway_pb2.TokenIds(ids=prompt),
            params=common_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
        token_ids, request_id = [], ""
        async for chunk in stub.Generate(request, timeout=120):
            token_ids += chunk.token_ids
            request_id = chunk.request_id
        return token_ids, await stub.GetRequest(gateway_pb2.GetRequestRequest(request_id=request_id), timeout=10)


def holds(cluster, replica_id: str, prompt: list[int]) -> bool:
    """Whether the prefill replica's published digest holds every full block of `prompt`."""
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True, socket_timeout=5)
    try:
        digest = decode_digest(client.get(digest_key("prefill", replica_id)) or "")
    finally:
        client.close()
    hashes = block_hashes(prompt, BLOCK_SIZE)
    return num_cached_blocks(hashes, digest) == len(hashes)


def served_by(endpoint: str, prompt: list[int]) -> tuple[list[int], str]:
    """Greedy tokens of one request, and the prefill replica that computed it."""
    token_ids, info = asyncio.run(generate(endpoint, prompt))
    return token_ids, info.prefill_replica


def test_requests_follow_their_cached_prefix_and_load_only_routing_ignores_it(make_cluster, e2e_model, hf_greedy):
    generator = torch.Generator().manual_seed(11)
    vocab_size = ModelConfig.from_dir(e2e_model).vocab_size
    tokens = lambda n: torch.randint(0, vocab_size, (n,), generator=generator).tolist()  # noqa: E731
    held_by_a, held_by_b = tokens(PROMPT_TOKENS), tokens(PROMPT_TOKENS)

    # "pb" alone first, so it computes one prompt; then "pa", which wins ties, computes the other.
    cluster = make_cluster([("prefill", "pb", ()), ("decode", "d0", ()), ("gateway", "gw", REMOTE)])
    _, first = asyncio.run(generate(cluster.gateway.endpoint, held_by_b))
    assert first.prefill_replica == "pb"
    bytes_per_block = first.kv_bytes // (PROMPT_TOKENS // BLOCK_SIZE)
    cluster.start("prefill", "pa")
    cluster.wait_ready()
    assert served_by(cluster.gateway.endpoint, held_by_a)[1] == "pa"

    # A digest reaches Redis with a heartbeat, and routing within a refresh after that.
    for replica, prompt in (("pa", held_by_a), ("pb", held_by_b)):
        cluster.wait_until(lambda: holds(cluster, replica, prompt), f"{replica}'s digest to hold its prompt",
                           ROUTING_TIMEOUT_S)
    time.sleep(DEFAULT_REFRESH_S)

    # In a row, so that load alone would spread them over both replicas.
    follow_ups = [(held_by_a if i < 3 else held_by_b) + tokens(5 + i) for i in range(6)]
    expected = hf_greedy(e2e_model, [(prompt, MAX_TOKENS) for prompt in follow_ups])
    cache_aware = [asyncio.run(generate(cluster.gateway.endpoint, prompt)) for prompt in follow_ups]
    assert [info.prefill_replica for _, info in cache_aware] == ["pa"] * 3 + ["pb"] * 3
    assert [output for output, _ in cache_aware] == expected
    assert [info.kv_bytes for _, info in cache_aware] == [bytes_per_block] * 6  # the one block after the prefix

    load_only = cluster.start("gateway", "gw-load", "--routing", "load", *REMOTE)
    cluster.wait_ready()
    assert [asyncio.run(generate(load_only.endpoint, prompt))[0] for prompt in follow_ups] == expected

    def hit_tokens() -> dict[str, int]:
        return {name: entry["prefix_cache_hits"] for name, entry in cluster.replicas("prefill").items()}

    # Each cache-aware follow-up found at least its whole held prompt's full blocks.
    cluster.wait_until(lambda: min(hit_tokens().values()) >= 3 * PROMPT_TOKENS,
                       "the prefill replicas to report their hits", ROUTING_TIMEOUT_S)
    cluster.assert_all_kv_free()
