"""Prefix digests through a real Redis: a replica's heartbeat publishes the hashes it holds, the
gateway reads them at most once per refresh, and a stopped replica's digest goes with it."""
import asyncio

import pytest

from pdserve.cluster.prefix_digest import MAX_DIGEST_HASHES, PrefixDigests, decode_digest, encode_digest, num_cached_blocks
from pdserve.cluster.redis_client import connect_redis
from pdserve.protocol.kv_blocks import block_hashes
from tests.cluster.test_registry import heartbeat, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]

WAIT_S = 10.0


class StepClock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self):
        return self.now_s


def test_a_digest_holds_a_bounded_number_of_hashes_and_matches_leading_blocks():
    hashes = block_hashes(list(range(64)), 16)  # 4 blocks
    digest = decode_digest(encode_digest(hashes[:2]))
    assert num_cached_blocks(hashes, digest) == 2
    assert num_cached_blocks(hashes, decode_digest(encode_digest(hashes[1:2]))) == 0  # block 1 alone: no prefix
    many = [bytes([i % 256, i // 256]) * 8 for i in range(MAX_DIGEST_HASHES + 10)]
    assert len(decode_digest(encode_digest(many))) == MAX_DIGEST_HASHES


def test_the_gateway_sees_a_replicas_prefixes_after_a_refresh_and_not_after_it_stops(redis_url):
    hashes = block_hashes(list(range(48)), 16)

    async def main():
        client = connect_redis(redis_url, timeout_s=2.0)
        clock = StepClock()
        digests = PrefixDigests(client, refresh_s=1.0, clock=clock)
        beat = heartbeat(redis_url, "p0", kind="prefill")
        replica = ("prefill", "p0")
        try:
            assert await digests.get([replica]) == {replica: frozenset()}  # nothing published yet
            await beat.start()
            beat.update_prefixes(hashes[:3])

            async def published():
                clock.now_s += 1.0  # every poll is a new refresh
                return num_cached_blocks(hashes, (await digests.get([replica]))[replica]) == 3

            await wait_until(published, WAIT_S)
            beat.update_prefixes(hashes[:1])
            await wait_until(lambda: _published_count(client, hashes, 1), WAIT_S)
            assert num_cached_blocks(hashes, (await digests.get([replica]))[replica]) == 3  # within the refresh
            clock.now_s += 1.0
            assert num_cached_blocks(hashes, (await digests.get([replica]))[replica]) == 1

            await beat.stop()
            clock.now_s += 1.0
            assert await digests.get([replica]) == {replica: frozenset()}
        finally:
            await client.aclose()

    asyncio.run(main())


async def _published_count(client, hashes, count) -> bool:
    fresh = PrefixDigests(client)
    return num_cached_blocks(hashes, (await fresh.get([("prefill", "p0")]))[("prefill", "p0")]) == count
