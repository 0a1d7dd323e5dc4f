"""A CPU pool's default size: half of the memory available, split between the replicas sharing
the host, held to /dev/shm's room for a pool that lives there; read from /proc/meminfo and
statvfs, and what an engine given no size allocates."""
import logging

import pytest

from pdserve.engine.cpu_kv_memory import (HostMemory, default_kv_memory_bytes, kv_memory_bytes, mem_available_bytes,
                                          read_host_memory)
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.errors import InvalidConfigError

GIB = 2**30
MEMINFO = """MemTotal:       24683772 kB
MemFree:        10000000 kB
MemAvailable:   20971520 kB
Buffers:          123456 kB
"""


def test_one_replica_takes_half_of_the_memory_available():
    assert kv_memory_bytes(HostMemory(available_bytes=20 * GIB, shm_free_bytes=64 * GIB)) == 10 * GIB


def test_replicas_sharing_the_host_split_that_half():
    assert kv_memory_bytes(HostMemory(20 * GIB, 64 * GIB), num_replicas=4) == 10 * GIB // 4


def test_a_pool_in_shared_memory_fits_in_what_dev_shm_has_left():
    small_shm = HostMemory(available_bytes=20 * GIB, shm_free_bytes=64 * 2**20)  # a container's default
    assert kv_memory_bytes(small_shm, in_shared_memory=True) == 64 * 2**20
    assert kv_memory_bytes(small_shm, num_replicas=2, in_shared_memory=True) == 32 * 2**20
    assert kv_memory_bytes(small_shm) == 10 * GIB  # a pool in the process's own memory
    assert kv_memory_bytes(HostMemory(20 * GIB, None), in_shared_memory=True) == 10 * GIB  # no /dev/shm


def test_no_replica_is_refused():
    with pytest.raises(InvalidConfigError, match="num_replicas"):
        kv_memory_bytes(HostMemory(20 * GIB, None), num_replicas=0)


def test_mem_available_is_read_in_bytes_and_its_absence_asks_for_a_size():
    assert mem_available_bytes(MEMINFO) == 20 * GIB
    with pytest.raises(InvalidConfigError, match="--kv-cache-memory"):
        mem_available_bytes("MemTotal:       24683772 kB\n")


def test_the_host_is_read_from_meminfo_and_the_shm_folders_file_system(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    host = read_host_memory(tmp_path / "meminfo", str(tmp_path))
    assert host.available_bytes == 20 * GIB and host.shm_free_bytes > 0
    assert read_host_memory(tmp_path / "meminfo", str(tmp_path / "absent")).shm_free_bytes is None
    with pytest.raises(InvalidConfigError, match="--kv-cache-memory"):
        read_host_memory(tmp_path / "absent", str(tmp_path))


def test_the_default_logs_the_figures_it_came_from(monkeypatch, caplog):
    monkeypatch.setattr("pdserve.engine.cpu_kv_memory.read_host_memory", lambda: HostMemory(20 * GIB, GIB))
    with caplog.at_level(logging.INFO, logger="pdserve.engine.cpu_kv_memory"):
        assert default_kv_memory_bytes(in_shared_memory=True) == GIB
    assert caplog.messages == [
        "KV pool of 1.00 GiB by default: 0.5 of the 20.00 GiB of memory available, 1.00 GiB free in /dev/shm"]


@pytest.mark.parametrize("in_shared_memory, pool_bytes", [(False, 32 * 2**20), (True, 8 * 2**20)])
def test_an_engine_given_no_size_on_a_cpu_takes_its_default_share(tiny_model, monkeypatch, in_shared_memory,
                                                                  pool_bytes):
    monkeypatch.setattr("pdserve.engine.cpu_kv_memory.read_host_memory",
                        lambda: HostMemory(available_bytes=64 * 2**20, shm_free_bytes=8 * 2**20))
    engine = LLMEngine(EngineConfig(model=tiny_model()), kv_pool_in_shared_memory=in_shared_memory)
    assert engine.load()["kv_pool_bytes"] == pool_bytes
    assert engine.allocator.num_blocks == pool_bytes // engine.kv_spec.bytes_per_block


def test_a_given_size_is_taken_as_it_is(tiny_model, monkeypatch):
    monkeypatch.setattr("pdserve.engine.cpu_kv_memory.read_host_memory", lambda: pytest.fail("read the host"))
    engine = LLMEngine(EngineConfig(model=tiny_model(), kv_cache_memory_bytes=4 * 2**20))
    assert engine.load()["kv_pool_bytes"] == 4 * 2**20
