"""The serving process's resident memory, as the kernel counts it (RSS).

RSS counts every page of the process present in memory: its own heap, the pages of shared
libraries it touched, and the pages of shared memory it maps and has touched (a decode replica's
KV pool in /dev/shm), so two replicas on one host may both count a page they share.
"""
from __future__ import annotations

import os


def resident_bytes() -> int:
    """This process's resident memory in bytes; 0 where /proc is not there (not Linux)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident_pages = int(statm.read().split()[1])
    except OSError:
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
