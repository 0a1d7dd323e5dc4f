"""Keeps `pdserve up`'s children running: one that exits is started again, after a backoff.

    starting ──ready──▶ serving ──exits──▶ backing off ──delay passes──▶ starting
        │                                      ▲
        └──exits, or not ready in time (killed)┘

Each slot (a replica, the gateway) holds one child at a time. The delay before a restart is
1 s, doubled at each restart up to 30 s, and back to 1 s once the child had served for 60 s.
A replica restarts on a fresh port with its old replica id and CPUs and registers itself, so
the gateway routes to it as soon as it is up; the gateway restarts on its fixed ports.

The deployment stops (`UpError`) only when it cannot go on: the gateway's restart fails (it
exits or is not ready in time: its ports are taken, say), or our Redis exits and cannot be
started again on its port (the replicas' heartbeats then re-register them in the new one).
The first start is stricter: any child exiting before all are ready aborts it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.child_process import Child, ChildSpec, UpLog
from pdserve.protocol.errors import PdserveError
from pdserve.redis_process import RedisProcess, RedisStartError, start_redis

_POLL_INTERVAL_S = 0.2
_REDIS_START_TIMEOUT_S = 10.0


class UpError(PdserveError):
    """The system could not be started or kept up; the message says what to do about it."""


class StopRequested(PdserveError):
    """Ctrl-C or SIGTERM arrived while starting."""


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 30.0
    reset_after_s: float = 60.0  # of serving, after which a failure counts as the first again

    def next_delay_s(self, last_delay_s: float | None, served_s: float) -> float:
        if last_delay_s is None or served_s >= self.reset_after_s:
            return self.initial_s
        return min(2 * last_delay_s, self.max_s)


class Slot:
    """A place for one child: the child in it now (None while backing off) and its history."""

    def __init__(self, name: str, make_spec: Callable[[], ChildSpec], *, fatal_if_restart_fails: bool = False):
        self.name = name
        self.make_spec = make_spec  # a fresh spec (a fresh port, for a replica) for each start
        self.fatal_if_restart_fails = fatal_if_restart_fails
        self.child: Child | None = None
        self.serving_since_s: float | None = None
        self.exited_s: float | None = None
        self.restart_at_s = 0.0
        self.last_delay_s: float | None = None
        self.num_restarts = 0


class Supervisor:
    def __init__(self, log: UpLog, startup_timeout_s: float, backoff: Backoff = Backoff()):
        self.redis: RedisProcess | None = None
        self._slots: list[Slot] = []
        self._log = log
        self._startup_timeout_s = startup_timeout_s
        self._backoff = backoff

    def start(self, slot: Slot) -> None:
        self._slots.append(slot)
        self._start(slot)
        self._log.say(f"{slot.name} started (pid {slot.child.pid}, {slot.child.spec.grpc_target})")

    def wait_ready(self, deadline_s: float, stop: threading.Event) -> None:
        """Returns once every child serves; raises UpError if one exits or time runs out."""
        pending = list(self._slots)
        while True:
            if (exited := next((s for s in self._slots if s.child.exit_code is not None), None)) is not None:
                raise exited_error(exited.child, "while starting")
            pending = [slot for slot in pending if not self._serving(slot)]
            if not pending:
                return
            if stop.is_set():
                raise StopRequested("stop requested while starting")
            if time.monotonic() >= deadline_s:
                waiting = ", ".join(f"{slot.name} ({slot.child.last_probe})" for slot in pending)
                raise UpError(f"not ready before the startup deadline: {waiting}")
            stop.wait(_POLL_INTERVAL_S)

    def supervise(self, stop: threading.Event) -> None:
        """Restarts what exits until `stop` is set; raises UpError when the deployment cannot go on."""
        while not stop.wait(_POLL_INTERVAL_S):
            self._check_redis()
            for slot in self._slots:
                self._check(slot, time.monotonic())

    def stop(self, timeout_s: float) -> None:
        """SIGTERM to every child, SIGKILL to those still running after timeout_s, then Redis."""
        children = [slot.child for slot in self._slots if slot.child is not None]
        for child in children:
            child.terminate()
        deadline_s = time.monotonic() + timeout_s
        for child in children:
            if child.wait(deadline_s - time.monotonic()) is None:
                self._log.say(f"{child.spec.name} did not stop within {timeout_s} s; killing it")
                child.kill()
                child.wait(timeout_s)
        if self.redis is not None:
            self.redis.stop(timeout_s=timeout_s)

    def _check(self, slot: Slot, now_s: float) -> None:
        if slot.child is None:
            if now_s >= slot.restart_at_s:
                slot.num_restarts += 1
                self._start(slot)
                self._log.say(f"{slot.name} restarted (restart {slot.num_restarts}, pid {slot.child.pid}, "
                              f"{slot.child.spec.grpc_target})")
            return
        if slot.child.exit_code is None and slot.serving_since_s is None:
            if self._serving(slot):
                self._log.say(f"{slot.name} serving again, {now_s - slot.exited_s:.1f} s after it exited")
            elif now_s - slot.child.started_s > self._startup_timeout_s:
                self._log.say(f"{slot.name} not ready within {self._startup_timeout_s} s "
                              f"({slot.child.last_probe}); killing it")
                slot.child.kill()
                slot.child.wait(self._startup_timeout_s)
        if (exit_code := slot.child.exit_code) is None:
            return
        if slot.serving_since_s is None and slot.fatal_if_restart_fails and slot.num_restarts > 0:
            raise exited_error(slot.child, "while restarting")
        served_s = 0.0 if slot.serving_since_s is None else now_s - slot.serving_since_s
        slot.last_delay_s = self._backoff.next_delay_s(slot.last_delay_s, served_s)
        slot.child, slot.serving_since_s, slot.exited_s = None, None, now_s
        slot.restart_at_s = now_s + slot.last_delay_s
        self._log.say(f"{slot.name} exited with status {exit_code} after serving {served_s:.1f} s; "
                      f"restarting it in {slot.last_delay_s:.0f} s")

    def _check_redis(self) -> None:
        if self.redis is None or (exit_code := self.redis.exit_code) is None:
            return
        port, data_dir, password = self.redis.port, self.redis.data_dir, self.redis.password
        self._log.say(f"Redis exited with status {exit_code}; starting it again on port {port}")
        self.redis = None
        try:
            self.redis = start_redis(port, data_dir=data_dir, timeout_s=_REDIS_START_TIMEOUT_S, password=password)
        except RedisStartError as error:
            raise UpError(f"Redis exited with status {exit_code} and cannot be started again: {error}") from error
        self._log.say(f"Redis serving again on port {port} (pid {self.redis.pid})")

    def _start(self, slot: Slot) -> None:
        slot.child = Child(slot.make_spec(), self._log)

    def _serving(self, slot: Slot) -> bool:
        if slot.serving_since_s is None and slot.child.probe_ready():
            slot.serving_since_s = time.monotonic()
        return slot.serving_since_s is not None


def exited_error(child: Child, when: str) -> UpError:
    return UpError(f"{child.spec.name} exited with status {child.exit_code} {when}; "
                   f"its last output:\n{child.last_lines()}")
