"""free_port never hands out a reserved port (one promised to a process that has not bound it
yet), and gives up with OSError rather than loop when the kernel offers nothing else."""
from pathlib import Path

import pytest

from pdserve.cluster.ports import MAX_PICKS, free_port


def ephemeral_ports() -> range:
    first, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(first, last + 1)


def test_a_reserved_port_is_never_picked():
    taken = free_port("127.0.0.1")
    reserved = {taken, *range(taken - 50, taken + 50)}
    assert all(free_port("127.0.0.1", reserved) not in reserved for _ in range(MAX_PICKS))


def test_no_port_outside_the_reserved_ones_is_an_error():
    with pytest.raises(OSError, match=f"no free port on 127.0.0.1 outside the .* reserved in {MAX_PICKS} picks"):
        free_port("127.0.0.1", set(ephemeral_ports()))
