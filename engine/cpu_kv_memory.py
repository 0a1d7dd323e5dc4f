"""How much memory a CPU replica's KV pool takes when no size is given, after vLLM's CPU backend
(which, with VLLM_CPU_KVCACHE_SPACE unset, gives the pool half of the memory of a NUMA node):

    pool bytes = KV_MEMORY_FRACTION * MemAvailable / num_replicas
                 and, for a pool in shared memory, no more than /dev/shm's free space / num_replicas

- MemAvailable (/proc/meminfo) is what the kernel can hand out without swapping. A replica reads
  it with its weights loaded, so they are not counted; the other half is left to activations
  and everything else on the host.
- num_replicas are the CPU replicas that share the host's memory. `pdserve up` counts its own
  and gives each its share with --kv-cache-memory; a replica started on its own counts 1.
- A decode replica's pool is a segment in /dev/shm (kvtransfer/shm.py): a segment larger than the
  room left there faults when touched, and containers mount as little as 64 MiB by default.

`kv_memory_bytes` is the rule on given figures, `read_host_memory` reads them from this machine,
`default_kv_memory_bytes` does both for a replica on its own and logs the figures. Imports no
torch: `pdserve up` sizes its replicas' pools without loading the engine.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pdserve.protocol.errors import InvalidConfigError

logger = logging.getLogger(__name__)

KV_MEMORY_FRACTION = 0.5
MEMINFO_PATH = Path("/proc/meminfo")
SHM_DIR = "/dev/shm"


@dataclass(frozen=True, slots=True)
class HostMemory:
    available_bytes: int  # MemAvailable
    shm_free_bytes: int | None  # room left in /dev/shm; None where there is none (shared memory is the kernel's)


def kv_memory_bytes(host: HostMemory, num_replicas: int = 1, in_shared_memory: bool = False) -> int:
    """One replica's pool: its part of KV_MEMORY_FRACTION of the memory available, held to its part
    of /dev/shm's room when the pool lives there."""
    if num_replicas < 1:
        raise InvalidConfigError(f"num_replicas must be >= 1, got {num_replicas}")
    host_bytes = int(KV_MEMORY_FRACTION * host.available_bytes)
    if in_shared_memory and host.shm_free_bytes is not None:
        host_bytes = min(host_bytes, host.shm_free_bytes)
    return host_bytes // num_replicas


def mem_available_bytes(meminfo_text: str) -> int:
    """MemAvailable of a /proc/meminfo text, in bytes."""
    for line in meminfo_text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable" and value.split()[1:] == ["kB"]:
            return int(value.split()[0]) * 1024
    raise InvalidConfigError("/proc/meminfo gives no MemAvailable in kB: give the KV pool's size (--kv-cache-memory)")


def read_host_memory(meminfo_path: Path = MEMINFO_PATH, shm_dir: str = SHM_DIR) -> HostMemory:
    """This machine's figures, now."""
    try:
        meminfo_text = meminfo_path.read_text()
    except OSError as error:
        raise InvalidConfigError(
            f"cannot read {meminfo_path} ({error.strerror}): give the KV pool's size (--kv-cache-memory)") from None
    try:
        shm = os.statvfs(shm_dir)
    except OSError:
        return HostMemory(mem_available_bytes(meminfo_text), None)
    return HostMemory(mem_available_bytes(meminfo_text), shm.f_bavail * shm.f_frsize)


def default_kv_memory_bytes(in_shared_memory: bool) -> int:
    """`kv_memory_bytes` of a replica on its own on this machine, now; logs what it came from."""
    host = read_host_memory()
    num_bytes = kv_memory_bytes(host, in_shared_memory=in_shared_memory)
    shm = (f", {host.shm_free_bytes / 2**30:.2f} GiB free in /dev/shm"
           if in_shared_memory and host.shm_free_bytes is not None else "")
    logger.info("KV pool of %.2f GiB by default: %g of the %.2f GiB of memory available%s",
                num_bytes / 2**30, KV_MEMORY_FRACTION, host.available_bytes / 2**30, shm)
    return num_bytes
