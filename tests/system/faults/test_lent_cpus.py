"""`pdserve up` on CPU with one prefill and one decode replica: while the prefill replica is idle
the decode replica's engine thread runs on both replicas' CPUs (engine/core_lease.py), under a
steady load every answer equals transformers', and once the load stops the engine thread is back
on its own CPUs. The replicas' threads are read from /proc."""
import os
from pathlib import Path

import pytest

from pdserve.engine.engine_args import parse_cpu_list
from pdserve.engine.thread_name import ENGINE_THREAD_NAME
from tests.helpers import wait_until
from tests.system.faults.up_deployment import SteadyLoad, cmdline, start_up, stop_up, wrong_outputs

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="lending needs a CPU for each replica")]
WIDEN_DEADLINE_S = 60.0


def cpus_flag(pid: int, flag: str) -> list[int]:
    argv = cmdline(pid)
    return parse_cpu_list(argv[argv.index(flag) + 1])


def engine_thread_cpus(pid: int) -> list[int]:
    """The CPUs the replica's engine thread may run on: the first thread of its name (OpenMP
    workers started from it inherit the name, and start later)."""
    tasks = sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda task: int(task.name))
    for task in tasks:
        if (task / "comm").read_text().strip() == ENGINE_THREAD_NAME:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    return parse_cpu_list(line.split(":", 1)[1].strip())
    raise AssertionError(f"replica {pid} has no {ENGINE_THREAD_NAME} thread")


def test_an_idle_prefill_replica_lends_its_cpus_to_the_decode_replica(fault_model, workload, tmp_path):
    cases, expected = workload
    up = start_up(tmp_path, fault_model)
    try:
        children = up.children()
        prefill, decode = children["prefill-0"], children["decode-0"]
        own, lent = cpus_flag(decode, "--cpus"), cpus_flag(prefill, "--cpus")
        assert cpus_flag(decode, "--borrow-cpus") == lent and not set(own) & set(lent)
        assert engine_thread_cpus(decode) == own
        with SteadyLoad(up.gateway, cases, num_streams=1) as load:
            wait_until(lambda: engine_thread_cpus(decode) == sorted(own + lent),
                       "the decode replica to step on the prefill replica's CPUs", WIDEN_DEADLINE_S)
            wait_until(lambda: len(load.outcomes) >= len(cases), "a round of the workload", WIDEN_DEADLINE_S)
        assert engine_thread_cpus(prefill) == lent  # the lender never moves
        wait_until(lambda: engine_thread_cpus(decode) == own, "the decode replica to return the CPUs once idle")
        failed = [outcome for outcome in load.outcomes if outcome.token_ids is None]
        assert not failed and not wrong_outputs(load.outcomes, expected), (failed, load.outcomes)
    finally:
        stop_up(up)
