"""The host id as a specification: two processes get the same one exactly when they can share KV
memory, that is run on one kernel and see one /dev/shm file system."""
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.cluster.registry import default_host_id

BOOT_ID = "0f6c1a52-5b8e-4d43-9a55-0d6a1f1f2b10"


@pytest.fixture
def boot_id_path(tmp_path) -> Path:
    path = tmp_path / "boot_id"
    path.write_text(BOOT_ID + "\n")
    return path


def test_every_process_on_this_machine_gets_the_same_id():
    """Even under another hostname, as containers on one machine have: the kernel is what they share."""
    script = "import socket; socket.gethostname = lambda: 'other-container'; " \
             "from pdserve.cluster.registry import default_host_id; print(default_host_id())"
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == default_host_id()
    assert "other-container" not in default_host_id()


def test_one_shm_file_system_seen_at_two_paths_is_one_host(boot_id_path, tmp_path):
    """As a container with `ipc: host` sees the host's /dev/shm through a bind mount."""
    (tmp_path / "bound").mkdir()
    assert default_host_id(boot_id_path, tmp_path) == default_host_id(boot_id_path, tmp_path / "bound")


def test_a_private_shm_on_the_same_kernel_is_another_host(boot_id_path, tmp_path):
    """As a Kubernetes pod's own /dev/shm is: the same boot id, but segments the other cannot open."""
    private_shm = Path("/dev/shm")
    if not private_shm.exists() or private_shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm and a temporary folder on two different file systems")
    ours, theirs = default_host_id(boot_id_path, tmp_path), default_host_id(boot_id_path, private_shm)
    assert ours != theirs
    assert ours.startswith(f"boot-{BOOT_ID}-") and theirs.startswith(f"boot-{BOOT_ID}-")


def test_another_kernel_is_another_host(boot_id_path, tmp_path):
    other_boot_id_path = tmp_path / "other_boot_id"
    other_boot_id_path.write_text("5d0b6b7e-2f6d-4a8e-8f0e-3c1f4f9a7e21\n")
    assert default_host_id(boot_id_path, tmp_path) != default_host_id(other_boot_id_path, tmp_path)


def test_without_a_dev_shm_the_kernel_alone_names_the_host(boot_id_path, tmp_path):
    assert default_host_id(boot_id_path, tmp_path / "no-shm") == f"boot-{BOOT_ID}"


def test_without_a_boot_id_the_hostname_names_the_kernel(tmp_path):
    host_id = default_host_id(tmp_path / "no-boot-id", tmp_path)
    assert host_id.startswith(socket.gethostname() + "-shm-")
