"""Tests against a real redis-server: one per session on a free loopback port, emptied before
each test."""
import pytest
import redis

from pdserve.redis_process import start_redis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    with start_redis(data_dir=tmp_path_factory.mktemp("redis"), timeout_s=10.0) as server:
        yield server.url


@pytest.fixture(autouse=True)
def _empty_redis(redis_url):
    with redis.Redis.from_url(redis_url, socket_timeout=5.0) as client:
        client.flushall()
