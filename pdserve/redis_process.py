"""A private redis-server child process on a loopback port, for `pdserve up` and the tests.

It keeps nothing on disk (no RDB snapshots, no append-only file), writes its output to
`data_dir/redis.log`, and counts as started only once it answers. With no port given it
takes a free one; if redis-server exits at once (another process took that port before it could
bind), it tries a fresh port, up to three in all.
"""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis

_HOST = "127.0.0.1"
_PORT_ATTEMPTS = 3
_POLL_INTERVAL_S = 0.02
_PROBE_TIMEOUT_S = 0.25  # one probe; a slow answer is simply asked again


class RedisStartError(RuntimeError):
    """redis-server exited or stayed silent instead of answering in time."""


class _RedisExitedError(RedisStartError):
    """redis-server exited before answering (bad arguments, or its port was taken)."""


class RedisProcess:
    """A running redis-server; `stop()` (or leaving a `with` block) ends it."""

    def __init__(self, process: subprocess.Popen, port: int, data_dir: Path):
        self._process = process
        self.port = port
        self.data_dir = data_dir
        self.url = f"redis://{_HOST}:{port}/0"

    @property
    def pid(self) -> int:
        return self._process.pid

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
    executable: str = "redis-server",
) -> RedisProcess:
    """Starts redis-server on `port` (a free one when None) and returns once it answers."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if port is not None:
        return _start_once(executable, port, data_dir, timeout_s)
    for _ in range(_PORT_ATTEMPTS - 1):
        try:
            return _start_once(executable, _free_port(), data_dir, timeout_s)
        except _RedisExitedError:
            continue
    return _start_once(executable, _free_port(), data_dir, timeout_s)


def _start_once(executable: str, port: int, data_dir: Path, timeout_s: float) -> RedisProcess:
    log_path = data_dir / "redis.log"
    command = [
        executable,
        "--port", str(port),
        "--bind", _HOST,
        "--dir", str(data_dir),
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C goes to our owner, who stops us last
        )
    started = RedisProcess(process, port, data_dir)
    deadline = time.monotonic() + timeout_s
    probe_timeout_s = min(timeout_s, _PROBE_TIMEOUT_S)
    client = redis.Redis(
        host=_HOST, port=port, socket_timeout=probe_timeout_s, socket_connect_timeout=probe_timeout_s, retry=None
    )
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise _RedisExitedError(f"redis-server exited with {process.returncode} on port {port}: {_tail(log_path)}")
            try:
                # The pid check tells our server from another one already listening on the port.
                if client.info("server")["process_id"] == process.pid:
                    return started
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            time.sleep(_POLL_INTERVAL_S)
        started.stop()
        raise RedisStartError(f"redis-server on port {port} did not answer within {timeout_s} s: {_tail(log_path)}")
    finally:
        client.close()


def _tail(log_path: Path, num_chars: int = 2000) -> str:
    return log_path.read_text(errors="replace")[-num_chars:].strip()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((_HOST, 0))
        return probe.getsockname()[1]
