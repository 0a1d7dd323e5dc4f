"""The private Redis, with each server installed: answers once started, keeps nothing on disk,
stops for good."""
import socket

import pytest
import redis

from pdserve.redis_process import RedisStartError, start_redis

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]


def test_a_started_server_answers_on_loopback_and_keeps_nothing_on_disk(tmp_path, redis_executable):
    with start_redis(data_dir=tmp_path, timeout_s=10.0, executable=redis_executable) as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(server.url, socket_timeout=5.0) as client:
            assert client.info("server")["process_id"] == server.pid
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "no"}
            client.set("k", "v")
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=server.port, socket_connect_timeout=1.0, retry=None).ping()
    assert [path.name for path in tmp_path.iterdir()] == ["redis.log"]


def test_two_servers_get_different_free_ports(tmp_path, redis_executable):
    with start_redis(data_dir=tmp_path / "a", timeout_s=10.0, executable=redis_executable) as a, \
            start_redis(data_dir=tmp_path / "b", timeout_s=10.0, executable=redis_executable) as b:
        assert a.port != b.port


def test_a_taken_port_is_a_start_error_that_says_why(tmp_path, redis_executable):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(RedisStartError, match="Address already in use"):
            start_redis(holder.getsockname()[1], data_dir=tmp_path, timeout_s=10.0, executable=redis_executable)


def test_a_server_with_a_password_refuses_clients_without_it(tmp_path, redis_executable):
    import asyncio

    from pdserve.cluster.redis_client import connect_redis

    with start_redis(data_dir=tmp_path, timeout_s=10.0, executable=redis_executable, password="pw-1234") as server:
        assert server.url == f"redis://:pw-1234@127.0.0.1:{server.port}/0"
        with redis.Redis(port=server.port, socket_timeout=5.0, retry=None) as stranger:
            with pytest.raises(redis.AuthenticationError):
                stranger.set("k", "v")
        with redis.Redis(port=server.port, password="wrong", socket_timeout=5.0, retry=None) as guesser:
            with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
                guesser.ping()

        async def with_the_url():
            client = connect_redis(server.url, timeout_s=5.0)
            try:
                await client.set("k", "v")
                return await client.get("k")
            finally:
                await client.aclose()

        assert asyncio.run(with_the_url()) == "v"
        conf = tmp_path / "redis.conf"
        assert conf.stat().st_mode & 0o077 == 0  # only its owner reads the password
