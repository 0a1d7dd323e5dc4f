"""CPU seconds of a measured system's parts, read from /proc (Linux).

The front of a `pdserve up` system is its process tree (the `up` process and every descendant,
found by parent pid, since `up` starts each child in a session of its own) less the replicas
(`python -m pdserve prefill|decode ...`) and anything they start, plus this process, which runs
the benchmark client. Each replica's CPU is split into its engine thread's (named
`ENGINE_THREAD_NAME` for the OS) and the rest of it (gRPC, asyncio: what it does beside the engine),
summed by kind.
A thread's or process's CPU seconds are its utime + stime (/proc/.../stat, clock ticks); one that
exits between readings drops out, so a reading spans one steady system, not restarts.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pdserve.engine.thread_name import ENGINE_THREAD_NAME

REPLICA_COMMANDS = ("prefill", "decode")
_PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat (or PID/task/TID/stat) after the command name, which may hold spaces:
    fields 3 onward."""
    text = (_PROC / str(pid) / "stat").read_text()
    return text[text.rindex(")") + 2:].split()


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime: fields 14 and 15 of stat(5)


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


def replica_kind(pid: int) -> str | None:
    """"prefill" or "decode" for a replica's process, else None."""
    try:
        argv = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    words = [word.decode(errors="replace") for word in argv]
    return next((following for word, following in zip(words, words[1:])
                 if word == "pdserve" and following in REPLICA_COMMANDS), None)


def is_replica(pid: int) -> bool:
    return replica_kind(pid) is not None


def process_cpu_s(pid: int) -> float:
    """utime + stime of `pid` (all its threads) in seconds; 0 once it has gone."""
    try:
        return _cpu_s(_stat_fields(pid))
    except OSError:
        return 0.0


def engine_thread_cpu_s(pid: int) -> float:
    """CPU seconds of `pid`'s engine threads; 0 for a process without one, or gone."""
    total_s = 0.0
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            if (task / "comm").read_text().strip() == ENGINE_THREAD_NAME:
                total_s += _cpu_s(_stat_fields(f"{pid}/task/{task.name}"))
        except OSError:
            continue  # exited while we looked
    return total_s


def front_cpu_s(system_pid: int) -> float:
    """CPU seconds so far of the system's front processes and of this process (the client)."""
    return sum(process_cpu_s(pid) for pid in descendants(system_pid, prune=is_replica)) + time.process_time()


def system_cpu_s(system_pid: int) -> dict[str, float]:
    """CPU seconds so far of the front, and of the replicas by kind: their engine threads
    (`prefill_engine`, `decode_engine`) and the rest of them (`prefill`, `decode`)."""
    seconds = {"front": front_cpu_s(system_pid), **{f"{kind}{part}": 0.0 for kind in REPLICA_COMMANDS
                                                    for part in ("", "_engine")}}
    for pid in descendants(system_pid):
        if (kind := replica_kind(pid)) is not None:
            engine_s = engine_thread_cpu_s(pid)
            seconds[f"{kind}_engine"] += engine_s
            seconds[kind] += process_cpu_s(pid) - engine_s
    return seconds


def cpu_during(system_pid: int, call: Callable[[], T]) -> tuple[T, dict[str, float], float]:
    """`call()`'s result, the CPU seconds each part of the system took while it ran
    (`system_cpu_s`'s keys), and the wall seconds it took."""
    started_cpu_s, started_s = system_cpu_s(system_pid), time.monotonic()
    result = call()
    ended_cpu_s = system_cpu_s(system_pid)
    return result, {part: ended_cpu_s[part] - started_cpu_s[part] for part in ended_cpu_s}, time.monotonic() - started_s
