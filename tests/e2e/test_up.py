"""`pdserve up --model tiny` with no Redis given: it writes the tiny model into the user cache,
starts Redis, a prefill, a decode and a gateway as real processes, prints its endpoints, serves
`pdserve generate`, and on Ctrl-C leaves no process and no Redis behind.
"""
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

STARTUP_DEADLINE_S = 300.0  # includes writing the tiny model once and loading it twice
GENERATE_TIMEOUT_S = 120.0
SHUTDOWN_DEADLINE_S = 40.0  # up's own 15 s grace, plus exit and reaping

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def descendant_pids(root_pid: int) -> set[int]:
    """Every live process below root_pid in the process tree, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat_path in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_path.read_text()
        except OSError:
            continue
        parent_pid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(parent_pid, []).append(int(stat_path.parent.name))
    found, frontier = set(), [root_pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.add(child)
            frontier.append(child)
    return found


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def wait_for_endpoints(lines: queue.Queue, process: subprocess.Popen) -> str:
    """up's stdout from the first line up to "Ctrl-C stops everything."."""
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    printed = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            pytest.fail(f"pdserve up exited with {process.wait()} before printing its endpoints")
        printed.append(line)
        if line.startswith("Ctrl-C stops everything"):
            return "".join(printed)
    pytest.fail(f"pdserve up printed no endpoints within {STARTUP_DEADLINE_S} s")


@pytest.fixture
def up_process(tmp_path):
    """`pdserve up` on free gateway ports, with its log kept in tmp_path/up.log."""
    grpc_port, http_port = free_port(), free_port()
    environ = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pdserve", "up", "--model", "tiny", "--grpc-port", str(grpc_port),
             "--http-port", str(http_port)],
            stdout=subprocess.PIPE, stderr=log, text=True, env=environ, start_new_session=True)
    process.grpc_port = grpc_port
    process.log_path = log_path
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # children follow: they die with their parent
            process.wait(timeout=30)
        print(log_path.read_text()[-20000:])


def test_up_serves_generate_and_ctrl_c_stops_everything(up_process, tmp_path):
    lines = queue.Queue()
    threading.Thread(target=read_lines, args=(up_process.stdout, lines), daemon=True).start()
    endpoints = wait_for_endpoints(lines, up_process)

    assert f"127.0.0.1:{up_process.grpc_port}" in endpoints
    model_dir = tmp_path / "cache" / "pdserve" / "models" / "tiny-llama-v2"
    assert str(model_dir) in endpoints
    assert (model_dir / "config.json").is_file()
    redis_url = re.search(r"redis://\S+", endpoints).group(0)
    assert redis.Redis.from_url(redis_url, socket_timeout=5).ping()
    pids = descendant_pids(up_process.pid)
    assert len(pids) >= 4  # redis, prefill, decode, gateway

    generated = subprocess.run(
        [sys.executable, "-m", "pdserve", "generate", "hello", "--max-tokens", "8",
         "--gateway", f"127.0.0.1:{up_process.grpc_port}"],
        capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S)
    assert generated.returncode == 0, generated.stderr
    assert generated.stdout.rstrip("\n"), "no text printed"
    num_tokens = int(re.search(r"(\d+) tokens", generated.stderr).group(1))
    assert 1 <= num_tokens <= 8

    up_process.send_signal(signal.SIGINT)
    assert up_process.wait(timeout=SHUTDOWN_DEADLINE_S) == 0
    deadline = time.monotonic() + SHUTDOWN_DEADLINE_S
    while any(is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if is_alive(pid)]
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()


def run_up(*flags: str, tmp_path: Path) -> subprocess.CompletedProcess:
    environ = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "pdserve", "up", *flags], capture_output=True,
                          text=True, env=environ, timeout=STARTUP_DEADLINE_S)


def test_up_refuses_a_busy_gateway_port_and_names_the_flag(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy_port = taken.getsockname()[1]
        finished = run_up("--grpc-port", str(busy_port), "--http-port", str(free_port()),
                          tmp_path=tmp_path)
    assert finished.returncode == 1
    assert f"port {busy_port}" in finished.stderr
    assert "--grpc-port" in finished.stderr
    assert not (tmp_path / "cache").exists()  # it failed before doing any work


def test_a_child_that_exits_while_starting_aborts_up_with_its_last_output(tmp_path):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    finished = run_up("--model", str(not_a_model), "--grpc-port", str(free_port()),
                      "--http-port", str(free_port()), tmp_path=tmp_path)
    assert finished.returncode == 1
    failure = re.search(r"pdserve up: (\S+) exited with status \d+ while starting; "
                        r"its last output:\n(.*)", finished.stderr, re.DOTALL)
    assert failure, finished.stderr
    assert failure.group(2).strip()
    assert "Ctrl-C stops everything" not in finished.stdout
