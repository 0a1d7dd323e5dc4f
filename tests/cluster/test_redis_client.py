"""A burst of calls larger than the connection pool waits for connections instead of failing."""
import asyncio

import pytest

from pdserve.cluster.redis_client import connect_redis

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]


def test_a_burst_beyond_the_pool_size_waits_for_free_connections(redis_url):
    async def burst():
        client = connect_redis(redis_url, timeout_s=5.0, max_connections=4)
        try:
            await asyncio.gather(*(client.set(f"burst:{i}", i) for i in range(400)))
            return await client.get("burst:399")
        finally:
            await client.aclose()

    assert asyncio.run(burst()) == "399"
