"""CPU seconds of a measured system's front, read from /proc (Linux).

The front of a `pdserve up` system is its process tree (the `up` process and every descendant,
found by parent pid, since `up` starts each child in a session of its own) less the replicas
(`python -m pdserve prefill|decode ...`) and anything they start, plus this process, which runs
the benchmark client.
A process's CPU seconds are its utime + stime (/proc/PID/stat, clock ticks); a process that
exits between readings drops out, so a reading spans one steady system, not restarts.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

REPLICA_COMMANDS = ("prefill", "decode")
_PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces): fields 3 onward."""
    text = (_PROC / str(pid) / "stat").read_text()
    return text[text.rindex(")") + 2:].split()


def descendants(root_pid: int, prune: Callable[[int], bool] = lambda pid: False) -> list[int]:
    """`root_pid` and every live process below it, but no process for which `prune` holds nor any
    below one."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(_stat_fields(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, ValueError):
                continue  # exited while we looked
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        if not prune(pid):
            found.append(pid)
            todo += children.get(pid, [])
    return found


def is_replica(pid: int) -> bool:
    try:
        argv = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [word.decode(errors="replace") for word in argv]
    return any(word == "pdserve" and following in REPLICA_COMMANDS for word, following in zip(words, words[1:]))


def process_cpu_s(pid: int) -> float:
    """utime + stime of `pid` (all its threads) in seconds; 0 once it has gone."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # fields 14 and 15 of stat(5)


def front_cpu_s(system_pid: int) -> float:
    """CPU seconds so far of the system's front processes and of this process (the client)."""
    return sum(process_cpu_s(pid) for pid in descendants(system_pid, prune=is_replica)) + time.process_time()


def front_cpu_during(system_pid: int, call: Callable[[], T]) -> tuple[T, float, float]:
    """`call()`'s result, the front's CPU seconds while it ran, and the wall seconds it took."""
    started_cpu_s, started_s = front_cpu_s(system_pid), time.monotonic()
    result = call()
    return result, front_cpu_s(system_pid) - started_cpu_s, time.monotonic() - started_s
