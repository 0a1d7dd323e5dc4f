"""One child process of `pdserve up`, with its output copied into up's log.

Each line a child writes (stdout and stderr merged) goes to the log prefixed with the child's
name, and its last lines are kept for error messages; `up`'s own lines, its log records included,
are prefixed "up". Children run in their own sessions, so a terminal's Ctrl-C reaches only `up`,
which stops them; and they die with `up` (parent_death).
"""
from __future__ import annotations

import collections
import logging
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from pdserve.cluster.health_probe import probe_grpc, probe_http
from pdserve.cluster.internal_tls import InternalTls
from pdserve.parent_death import die_with_parent

_PROBE_TIMEOUT_S = 1.0
_NUM_LAST_LINES = 30


@dataclass(frozen=True, slots=True)
class ChildSpec:
    name: str  # prefix of its log lines, e.g. "decode-1"
    argv: tuple[str, ...]
    grpc_target: str  # "host:port" of its health service
    http_health_url: str | None = None  # also probed, when set
    env: dict[str, str] | None = None  # its environment (None: this process's)
    grpc_tls: InternalTls | None = None  # what probes of an internal service on mutual TLS present


class UpLog:
    """The log all children and `up` itself write to, one whole line at a time."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        with self._lock:
            self._stream.write(f"{name:<10}| {text}\n")
            self._stream.flush()

    def say(self, text: str) -> None:
        self.line("up", text)


class UpLogHandler(logging.Handler):
    """Log records of `up`'s own process as its lines in the log: the message, after the level
    when it is a warning or worse."""

    def __init__(self, log: UpLog):
        super().__init__()
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        self._log.say(level + record.getMessage())


class Child:
    def __init__(self, spec: ChildSpec, log: UpLog):
        self.spec = spec
        self.started_s = time.monotonic()
        self.last_probe = "not probed yet"
        self._last_lines: collections.deque[str] = collections.deque(maxlen=_NUM_LAST_LINES)
        self._process = subprocess.Popen(
            die_with_parent(spec.argv), env=spec.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True)
        self._copier = threading.Thread(target=self._copy_output, args=(log,), name=f"log-{spec.name}", daemon=True)
        self._copier.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def exit_code(self) -> int | None:
        return self._process.poll()

    def last_lines(self) -> str:
        self._copier.join(timeout=1.0)  # let the output of an exited child drain
        return "\n".join(self._last_lines)

    def probe_ready(self) -> bool:
        result = probe_grpc(self.spec.grpc_target, _PROBE_TIMEOUT_S, self.spec.grpc_tls)
        if result.ready and self.spec.http_health_url is not None:
            result = probe_http(self.spec.http_health_url, _PROBE_TIMEOUT_S)
        self.last_probe = result.detail
        return result.ready

    def terminate(self) -> None:
        if self.exit_code is None:
            self._process.terminate()

    def kill(self) -> None:
        if self.exit_code is None:
            self._process.kill()

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self._process.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def _copy_output(self, log: UpLog) -> None:
        for raw_line in self._process.stdout:
            line = raw_line.decode(errors="replace").rstrip("\n")
            self._last_lines.append(line)
            log.line(self.spec.name, line)
        self._process.stdout.close()
