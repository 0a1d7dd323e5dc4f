"""`pdserve up --model tiny` with no Redis given: it writes the tiny model into the user cache,
starts Redis, a prefill, a decode and a gateway as real processes, prints its endpoints, serves
`pdserve generate`, and on Ctrl-C leaves no process and no Redis behind. Its replicas speak
mutual TLS only, with certificates up made for the run in a folder only its owner enters, gone
once up stops. Its console reads one line per replica and stage, no health probe's access-log
line, no warning of running without a secret or TLS, and neither the deployment's internal
secret nor its Redis password.
"""
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import redis

from pdserve.cluster.health_probe import probe
from pdserve.cluster.internal_tls import CA_ENV, CERT_ENV, KEY_ENV, InternalTlsFiles
from pdserve.cluster.service_args import SECRET_ENV
from tests.helpers import (ENGINE_DTYPE, ENGINE_FLAGS, descendant_pids, environ_of, free_port, is_alive,
                           up_redis_url, wait_for_endpoints)

STARTUP_DEADLINE_S = 300.0  # includes writing the tiny model once and loading it twice
GENERATE_TIMEOUT_S = 120.0
SHUTDOWN_DEADLINE_S = 40.0  # up's own 15 s grace, plus exit and reaping

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def start_up(tmp_path):
    """Starts `pdserve up --model tiny FLAGS` on free gateway ports, with its log kept in
    tmp_path/up.log; kills whatever still runs at the end."""
    started = []

    def start(*flags: str) -> subprocess.Popen:
        grpc_port, http_port = free_port(), free_port()
        environ = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
        log_path = tmp_path / "up.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "pdserve", "up", "--model", "tiny", "--grpc-port", str(grpc_port),
                 "--http-port", str(http_port), *ENGINE_FLAGS, *flags],
                stdout=subprocess.PIPE, stderr=log, text=True, env=environ, start_new_session=True)
        process.grpc_port, process.http_port, process.log_path = grpc_port, http_port, log_path
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # children follow: they die with their parent
            process.wait(timeout=30)
        print(process.log_path.read_text()[-20000:])


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=SHUTDOWN_DEADLINE_S) == 0


def test_up_serves_generate_and_ctrl_c_stops_everything(start_up, tmp_path):
    up_process = start_up()
    endpoints = wait_for_endpoints(up_process, STARTUP_DEADLINE_S)

    assert f"127.0.0.1:{up_process.grpc_port}" in endpoints
    model_dir = tmp_path / "cache" / "pdserve" / "models" / "tiny-llama-v2"
    assert str(model_dir) in endpoints
    assert (model_dir / "config.json").is_file()
    redis_url = up_redis_url(endpoints)
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

    child_env = next(environ for pid in pids if CERT_ENV in (environ := environ_of(pid)))
    tls = InternalTlsFiles(*(Path(child_env[name]) for name in (CA_ENV, CERT_ENV, KEY_ENV)))
    assert stat.S_IMODE(tls.ca_path.parent.stat().st_mode) == 0o700
    decode = json.loads(redis.Redis.from_url(redis_url, socket_timeout=5).get("replica:decode:decode-0"))["endpoint"]
    assert probe(decode, 5.0, tls.load()).ready
    assert not probe(decode, 5.0).ready  # plaintext gets nothing

    stop(up_process)
    deadline = time.monotonic() + SHUTDOWN_DEADLINE_S
    while any(is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if is_alive(pid)]
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
    assert not tls.ca_path.parent.exists()


def test_up_logs_one_line_per_replica_and_stage_no_probe_and_no_secret(start_up):
    up_process = start_up("--decode", "2")
    endpoints = wait_for_endpoints(up_process, STARTUP_DEADLINE_S)
    environ = next(environ for pid in descendant_pids(up_process.pid) if SECRET_ENV in (environ := environ_of(pid)))
    secret, redis_password = environ[SECRET_ENV], urllib.parse.urlsplit(up_redis_url(endpoints)).password
    health_url = f"http://127.0.0.1:{up_process.http_port}/health"
    for _ in range(3):
        assert urllib.request.urlopen(health_url, timeout=10).status == 200
    body = json.dumps({"model": "tiny-llama-v2", "prompt": "hello", "max_tokens": 2}).encode()
    urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{up_process.http_port}/v1/completions", body, {"Content-Type": "application/json"}),
        timeout=GENERATE_TIMEOUT_S).read()
    stop(up_process)
    console = endpoints + up_process.log_path.read_text()

    for replica in ("prefill-0", "decode-0", "decode-1"):
        lines = [line.split("| ", 1)[1] for line in console.splitlines() if line.startswith(f"{replica:<10}| ")]
        assert len([line for line in lines if line.endswith(f" loading tiny-llama-v2 ({ENGINE_DTYPE} on cpu)")]) == 1, lines
        (ready,) = [match for line in lines if (match := re.search(
            rf" ready in [\d.]+ s: tiny-llama-v2 \({ENGINE_DTYPE} on cpu\), weights 0\.\d\d GiB, "
            r"KV pool (\d+) blocks x 16 = (\d+) tokens \(0\.50 GiB\), resident (\d+\.\d\d) GiB; "
            rf"{replica.split('-')[0]} replica {replica} serving on 127\.0\.0\.1:\d+$", line))]
        assert int(ready.group(2)) == int(ready.group(1)) * 16 > 0
        assert 0.1 < float(ready.group(3)) < 2  # torch alone takes about 0.27 GiB
    assert "/health" not in up_process.log_path.read_text()  # probed many times: up's own and ours
    assert '"POST /v1/completions HTTP/1.1" 200' in console  # requests are still logged
    assert secret not in console and redis_password not in console
    assert "no internal secret" not in console and "no internal TLS" not in console
    assert "redis://:***@127.0.0.1:" in endpoints


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
