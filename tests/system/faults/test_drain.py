"""Replicas drain on SIGTERM: a decode replica leaves the registry at once, finishes the requests
it runs, then exits; so decode replicas restarted one at a time under load fail no request."""
import os
import signal
import time

import pytest

from tests.system.faults.up_deployment import SteadyLoad, wrong_outputs
from tests.helpers import is_alive, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow]
DRAIN_TIMEOUT_S = 30.0  # the replicas' default --drain-timeout-s
RESTART_DEADLINE_S = 180.0


def sigterm_and_wait_for_exit(deployment, name: str) -> dict[str, float]:
    """SIGTERMs replica `name`; waits for it to leave the registry, exit, and serve again
    (restarted by `up` on a fresh port). Its timings, in seconds after the signal."""
    pid = deployment.children()[name]
    old_endpoint = deployment.registry("decode")[name]["endpoint"]
    signalled_s = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: deployment.registry("decode").get(name, {}).get("endpoint") != old_endpoint,
               f"{name} to deregister", DRAIN_TIMEOUT_S)
    timings = {"deregistered_s": time.monotonic() - signalled_s, "alive_when_deregistered": is_alive(pid)}
    wait_until(lambda: not is_alive(pid), f"{name} to exit", DRAIN_TIMEOUT_S + 15.0)
    timings["exited_s"] = time.monotonic() - signalled_s
    restarted = wait_until(lambda: (entry := deployment.registry("decode").get(name))
                           and entry["endpoint"] != old_endpoint and entry, f"a new {name} to register",
                           RESTART_DEADLINE_S)
    wait_until(lambda: deployment.serves(restarted["endpoint"]), f"the new {name} to serve", 30.0)
    timings["serving_again_s"] = time.monotonic() - signalled_s
    return timings


def test_sigterm_deregisters_a_busy_decode_replica_at_once_and_it_finishes_its_requests(deployment, workload):
    cases, expected = workload
    # The load runs until the replica has drained and is back, so the registry, which shows the
    # replicas' load as of their last report (up to two seconds old), sees one busy however slow
    # this machine is: a single burst can finish between two reports. Whichever replica the router
    # gave work to first: with prefix caching, a replica that holds the workload's prompts from
    # earlier tests may take all of it.
    with SteadyLoad(deployment.gateway, cases, num_streams=len(cases)) as load:
        busy = wait_until(lambda: next((name for name, entry in sorted(deployment.registry("decode").items())
                                        if entry["running_seqs"] > 0), None), "a decode replica to be busy", 60.0)
        timings = sigterm_and_wait_for_exit(deployment, busy)
    outcomes = load.outcomes

    on_drained = sum(o.decode_replica == busy for o in outcomes)
    print(f"SIGTERM busy {busy}: deregistered after {timings['deregistered_s']:.2f} s, exited after "
          f"{timings['exited_s']:.1f} s, serving again after {timings['serving_again_s']:.1f} s; "
          f"{len(outcomes)} requests, {on_drained} finished on {busy}, "
          f"{sum(o.token_ids is None for o in outcomes)} failed")
    assert timings["alive_when_deregistered"], timings  # it left the registry first, then drained
    assert timings["exited_s"] < DRAIN_TIMEOUT_S, timings
    assert [o.error for o in outcomes if o.token_ids is None] == []
    assert wrong_outputs(outcomes, expected) == []
    assert on_drained > 0, "no request ran on the drained replica"
    assert "drained in" in deployment.log()


def test_rolling_restart_of_the_decode_replicas_under_load_fails_no_request(deployment, workload):
    cases, expected = workload
    restarts = {}
    with SteadyLoad(deployment.gateway, cases, num_streams=4) as load:
        wait_until(lambda: len(load.outcomes) >= 4, "the load to get going", 120.0)
        for name in ("decode-0", "decode-1"):
            restarts[name] = sigterm_and_wait_for_exit(deployment, name)
        num_before_end = len(load.outcomes)
        wait_until(lambda: len(load.outcomes) >= num_before_end + 4, "requests after the restarts", 120.0)

    outcomes = load.outcomes
    failed = [o.error for o in outcomes if o.token_ids is None]
    print(f"rolling restart: {len(outcomes)} requests, {len(failed)} failed; " + "; ".join(
        f"{name} exited {t['exited_s']:.1f} s after SIGTERM, serving again after {t['serving_again_s']:.1f} s"
        for name, t in restarts.items()))
    assert failed == []
    assert wrong_outputs(outcomes, expected) == []
    assert {o.decode_replica for o in outcomes} == {"decode-0", "decode-1"}
