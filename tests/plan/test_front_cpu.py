"""The front's CPU: its model (share of the replicas' cores) and its reading from /proc."""
import os
import subprocess
import sys
import time

import pytest

from planner.front_cpu import FrontCpu
from planner.proc_cpu import descendants, front_cpu_during, front_cpu_s, is_replica, process_cpu_s
from planner.serving import front_from_readings
from planner.workload import SimRequest

FRONT = FrontCpu(shares_replica_cpus=True, idle_cpu_s_per_s=0.1, cpu_s_per_request=0.02, cpu_s_per_output_token=1e-3)


def test_the_fronts_cpu_is_idle_plus_rate_times_each_requests_cost():
    requests = [SimRequest(0.25 * i, 100, 10 + 20 * (i % 2)) for i in range(41)]  # 4 req/s over 10 s
    mean_output_len = (21 * 10 + 20 * 30) / 41
    assert FRONT.cpu_s_per_s(requests) == pytest.approx(0.1 + 4 * (0.02 + 1e-3 * mean_output_len))
    # 0.1 + 4 * 0.05 = 0.3 of 2 cores: each step takes 1 / (1 - 0.15)
    assert FRONT.step_stretch([SimRequest(0.25 * i, 100, 30) for i in range(41)], 2) == pytest.approx(1 / 0.85)


def test_a_trace_without_a_rate_costs_the_idle_front_only():
    assert FRONT.cpu_s_per_s([SimRequest(0.0, 100, 10)] * 16) == pytest.approx(0.1)


def test_a_front_off_the_replicas_cores_or_unmeasured_slows_nothing():
    requests = [SimRequest(0.01 * i, 100, 10) for i in range(100)]
    assert FrontCpu().step_stretch(requests, 2) == 1.0
    assert FrontCpu(False, 0.5, 0.05, 1e-3).step_stretch(requests, 2) == 1.0


def test_a_front_taking_every_cpu_is_refused():
    with pytest.raises(ValueError):
        FrontCpu(True, cpu_s_per_request=0.1).step_stretch([SimRequest(0.01 * i, 100, 10) for i in range(100)], 4)


def test_the_fronts_costs_are_regressed_from_runs_beyond_the_idle_rate():
    idle, per_request, per_token = 0.05, 0.01, 2e-4
    readings = [{"num_requests": n, "num_output_tokens": n * out, "wall_s": wall,
                 "cpu_s": idle * wall + n * per_request + n * out * per_token}
                for n, out, wall in [(5, 8, 3.0), (5, 64, 3.5), (16, 64, 1.0), (5, 8, 3.1)]]
    front = front_from_readings(idle, readings)
    assert front.shares_replica_cpus and front.idle_cpu_s_per_s == idle
    assert (front.cpu_s_per_request, front.cpu_s_per_output_token) == pytest.approx((per_request, per_token))


def _poll(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_cpu_seconds_are_read_per_process_and_replicas_left_out_of_the_front():
    # each child spends 0.3 s of CPU, then sleeps
    busy = "import time\nwhile time.process_time() < 0.3: pass\nwhile True: time.sleep(0.01)"
    front = subprocess.Popen([sys.executable, "-c", busy])
    replica = subprocess.Popen([sys.executable, "-c", busy, "pdserve", "decode"])
    try:
        assert {front.pid, replica.pid} <= set(descendants(os.getpid())) and descendants(front.pid) == [front.pid]
        assert _poll(lambda: is_replica(replica.pid)) and not is_replica(front.pid)
        pruned = descendants(os.getpid(), prune=is_replica)
        assert front.pid in pruned and replica.pid not in pruned
        assert _poll(lambda: process_cpu_s(front.pid) >= 0.3 and process_cpu_s(replica.pid) >= 0.3)
        assert front_cpu_s(front.pid) == pytest.approx(process_cpu_s(front.pid) + time.process_time(), abs=0.05)
    finally:
        for process in (front, replica):
            process.kill()
            process.wait()
    assert process_cpu_s(front.pid) == 0.0


def test_a_call_is_timed_with_the_cpu_the_front_took_while_it_ran():
    def spin() -> str:
        end_s = time.process_time() + 0.2
        while time.process_time() < end_s:
            pass
        return "done"

    result, cpu_s, wall_s = front_cpu_during(os.getpid(), spin)
    assert result == "done" and 0.2 <= cpu_s and 0.2 <= wall_s
