"""`pdserve up --model tiny` with no Redis given: it writes the tiny model into the user cache,
starts Redis, a prefill, a decode and a gateway as real processes, prints its endpoints, serves
`pdserve generate`, and on Ctrl-C leaves no process and no Redis behind.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from tests.helpers import descendant_pids, free_port, is_alive, wait_for_endpoints

STARTUP_DEADLINE_S = 300.0  # includes writing the tiny model once and loading it twice
GENERATE_TIMEOUT_S = 120.0
SHUTDOWN_DEADLINE_S = 40.0  # up's own 15 s grace, plus exit and reaping

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


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
    endpoints = wait_for_endpoints(up_process, STARTUP_DEADLINE_S)

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
