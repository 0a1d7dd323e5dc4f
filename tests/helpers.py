"""Process helpers shared by the tests that start real processes: the KV pool size of every engine
they start (pool and dtype), a free loopback port, whether a pid still runs, a process's children from /proc,
polling until a condition holds, and waiting for `pdserve up` to print its endpoints (and reading
its own Redis's URL from them) or for a server's health route to answer.

Import them as `from tests.helpers import free_port` (the suite runs with --import-mode=importlib,
under which `tests` is a namespace package rooted at this folder, as tests/system and tests/deploy
already use it).
"""
from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from pathlib import Path

from pdserve.cluster import ports

UP_READY_LINE = "Ctrl-C stops everything"  # the last line `pdserve up` prints once it is up
KV_CACHE_MEMORY_BYTES = 512 * 2**20
"""The KV pool of every engine the tests start, given explicitly: small, and the same on every
machine, whatever pdserve's default (which follows the machine's memory on a CPU)."""
ENGINE_DTYPE = "float32"
"""The dtype of every engine the tests start, given explicitly: they compare greedy tokens across
batch shapes, prompt chunkings, preemptions and migrations, which agree exactly only in float32.
bfloat16, the default where the CPU has it, rounds differently with the shape of the batch (its
own agreement rule is tests/real_model/test_bfloat16.py's)."""
ENGINE_OPTIONS = {"kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES, "dtype": ENGINE_DTYPE}  # for an in-process LLM
ENGINE_FLAGS = ("--kv-cache-memory", str(KV_CACHE_MEMORY_BYTES), "--dtype", ENGINE_DTYPE)  # for a started one


def free_port() -> int:
    """A loopback port nothing listens on right now (pdserve's own pick, as `pdserve up` makes it)."""
    return ports.free_port("127.0.0.1")


def is_alive(pid: int) -> bool:
    """pid runs (a zombie, exited but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat_path in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_path.read_text()
        except OSError:
            continue
        parent_pid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(parent_pid, []).append(int(stat_path.parent.name))
    return children


def environ_of(pid: int) -> dict[str, str]:
    """The environment pid started with, read from /proc; empty once it has exited."""
    try:
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in entries if entry)


def children_of(parent_pid: int) -> list[int]:
    """The processes whose parent is parent_pid, read from /proc."""
    return _children_by_parent().get(parent_pid, [])


def descendant_pids(root_pid: int) -> set[int]:
    """Every process below root_pid in the process tree, read from /proc."""
    children = _children_by_parent()
    found, frontier = set(), [root_pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.add(child)
            frontier.append(child)
    return found


def wait_until(condition, what: str, timeout_s: float = 30.0, poll_s: float = 0.05):
    """Polls `condition` until it returns something truthy, which it returns; an AssertionError
    naming `what` after timeout_s."""
    deadline_s = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
    return value


def wait_for_endpoints(process: subprocess.Popen, timeout_s: float) -> str:
    """`pdserve up`'s stdout (a text pipe) from its first line up to the one saying it is up.

    An AssertionError if up exits first or prints no such line within timeout_s. A daemon thread
    keeps reading the pipe afterwards, so up never blocks on a full one."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline_s = time.monotonic() + timeout_s
    printed = []
    while time.monotonic() < deadline_s:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError(f"pdserve up exited with {process.wait()} before printing its endpoints")
        printed.append(line)
        if line.startswith(UP_READY_LINE):
            return "".join(printed)
    raise AssertionError(f"pdserve up printed no endpoints within {timeout_s} s")


def up_redis_url(endpoints: str) -> str:
    """The URL, password included, of the Redis `pdserve up` started: its endpoints show the URL
    without the password and name the file, readable by its owner alone, that holds all of it."""
    url_file = Path(re.search(r"the URL with its password: (\S+)\)", endpoints).group(1))
    assert url_file.stat().st_mode & 0o077 == 0, f"{url_file} is readable by others"
    return url_file.read_text().strip()


def wait_for_health(process: subprocess.Popen, url: str, timeout_s: float) -> None:
    """Polls the HTTP health route at url until it answers ready; an AssertionError if the process
    exits first or timeout_s passes."""
    from pdserve.cluster.health_probe import probe_http

    deadline_s = time.monotonic() + timeout_s
    while not probe_http(url, timeout_s=1).ready:
        assert process.poll() is None, f"{process.args} exited with {process.returncode} before {url} was ready"
        assert time.monotonic() < deadline_s, f"{url} not ready within {timeout_s} s"
        time.sleep(0.2)
