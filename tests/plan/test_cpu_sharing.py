"""The CPU work beside the engines (planner/cpu_sharing.py): its regression from profile runs,
and its reading from /proc."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from pdserve.planner.proc_cpu import (cpu_during, descendants, engine_thread_cpu_s, front_cpu_s, is_replica, process_cpu_s,
                              replica_kind)
from pdserve.planner.serving import demand_from_readings, sharing_from_readings

def test_the_costs_are_regressed_from_runs_beyond_the_idle_rate():
    idle, per_request, per_token, per_step = 0.05, 0.01, 2e-4, 5e-4
    runs = [(5, 8, 5 * 7, 3.0), (5, 64, 5 * 63, 3.5), (16, 64, 63, 1.0), (5, 8, 5 * 7, 3.1)]  # the last but one: a wave
    readings = [{"num_requests": n, "num_output_tokens": n * out, "num_decode_steps": steps, "wall_s": wall,
                 "cpu_s": {"front": idle * wall + n * per_request + n * out * per_token + steps * per_step,
                           "prefill": 0.01 * wall + 0.003 * n, "decode": 0.0}}
                for n, out, steps, wall in runs]
    front = demand_from_readings("front", idle, readings)
    assert front.idle_s_per_s == idle
    assert (front.per_request_s, front.per_output_token_s, front.per_decode_step_s) == pytest.approx(
        (per_request, per_token, per_step))
    sharing = sharing_from_readings({"front": idle, "prefill": 0.01, "decode": 0.0}, readings)
    assert sharing.shares_replica_cpus and sharing.front == front
    assert sharing.prefill.per_request_s == pytest.approx(0.003)
    assert (sharing.prefill.per_output_token_s, sharing.prefill.per_decode_step_s) == (0.0, 0.0)


def _unchanged_over(read, interval_s: float) -> bool:
    before = read()
    time.sleep(interval_s)
    return read() == before


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
        assert replica_kind(replica.pid) == "decode" and replica_kind(front.pid) is None
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

    result, cpu_s, wall_s = cpu_during(os.getpid(), spin)
    assert result == "done" and 0.2 <= cpu_s["front"] and 0.2 <= wall_s
    assert set(cpu_s) == {"front", "prefill", "prefill_engine", "decode", "decode_engine"}


def test_a_replicas_engine_thread_is_told_from_the_rest_of_it():
    # the engine thread spends 0.4 s of CPU, the main thread 0.1 s, then both sleep
    replica = textwrap.dedent("""
        import threading, time
        from pdserve.engine.thread_name import ENGINE_THREAD_NAME, name_this_thread
        def spin(cpu_s):
            end_s = time.thread_time() + cpu_s
            while time.thread_time() < end_s:
                pass
        def engine():
            name_this_thread(ENGINE_THREAD_NAME)
            spin(0.4)
            time.sleep(600)
        threading.Thread(target=engine, daemon=True).start()
        spin(0.1)
        time.sleep(600)
    """)
    process = subprocess.Popen([sys.executable, "-c", replica, "pdserve", "prefill"])
    try:
        # both threads done spinning: their CPU has reached what they spin and stays there
        assert _poll(lambda: engine_thread_cpu_s(process.pid) >= 0.37 and process_cpu_s(process.pid) >= 0.47
                     and _unchanged_over(lambda: process_cpu_s(process.pid), 0.05))
        assert engine_thread_cpu_s(process.pid) == pytest.approx(0.4, abs=0.03)
    finally:
        process.kill()
        process.wait()
    assert engine_thread_cpu_s(process.pid) == 0.0
