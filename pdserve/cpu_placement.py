"""Which CPUs each replica of `pdserve up` runs on, when the replicas run on CPU.

Replicas that share cores run their torch threads against each other: OpenMP workers spin while
they wait for a core, and two engines with two threads each on two cores run several times
slower than one engine alone. So the CPUs this process may use are split into disjoint,
contiguous sets, one per replica, prefill replicas first; each replica pins itself to its set
and runs that many torch threads (`--cpus`). Sets differ in size by at most one, the larger ones
going first. With fewer CPUs than replicas, replicas take one CPU each in turn and some share.
The gateway and Redis are not pinned.
"""
from __future__ import annotations


def split_cpus(cpus: list[int], num_replicas: int) -> list[list[int]]:
    cpus = sorted(cpus)
    if num_replicas > len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(num_replicas)]
    size, num_larger = divmod(len(cpus), num_replicas)
    sets, start = [], 0
    for i in range(num_replicas):
        end = start + size + (i < num_larger)
        sets.append(cpus[start:end])
        start = end
    return sets


def cpu_list_arg(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))
