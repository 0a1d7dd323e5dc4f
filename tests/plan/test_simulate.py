import dataclasses

import numpy as np
import pytest

from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.profile import DecodeFit, DecodeSample, PrefillFit, PrefillSample, Profile, ServingOverhead
from pdserve.planner.simulate import Simulation, XpYd, simulate
from pdserve.planner.workload import SimRequest, Slo, Workload

from tests.plan.profiles import make_profile

ONE_TO_ONE = XpYd(1, 1)
SLO_LOOSE = Slo(10_000, 10_000)


def test_a_request_alone_waits_for_nothing_but_its_own_steps_and_the_overheads():
    serving = ServingOverhead(gateway_s=0.002, ttft_s=0.003, handoff_s=0.004, step_s=0.0005, per_seq_step_s=0.0001)
    profile = make_profile(decode=DecodeFit(0.005, 0.001, 1e-6), serving=serving)
    [times] = Simulation(profile, ONE_TO_ONE).run([SimRequest(1.0, 100, 5)])

    prefill_s = 0.010 + 0.0001 * 100
    assert times.ttft_s == pytest.approx(0.002 + prefill_s + 0.003)
    transfer_s = 100 * 1000 / 1e9
    # alone in its batch: no per_seq_step_s, which counts the running requests beyond the first
    steps_s = sum(0.005 + 0.001 + 1e-6 * (100 + generated) + 0.0005 for generated in range(1, 5))
    assert times.finish_s - times.first_token_s == pytest.approx(0.004 + transfer_s + steps_s)


def test_a_one_token_request_ends_at_its_first_token():
    [times] = Simulation(make_profile(), ONE_TO_ONE).run([SimRequest(0.0, 50, 1)])
    assert times.finish_s == times.first_token_s
    assert times.tpot_s == 0.0


def test_a_burst_decodes_as_one_batch_so_tpot_is_the_step_time_at_that_batch():
    profile = make_profile(prefill=PrefillFit(1e-6, 0.0, 0.0), transfer_gb_per_s=1e12)
    requests = [SimRequest(0.0, 16, 101) for _ in range(8)]
    times = Simulation(profile, ONE_TO_ONE).run(requests)
    step_s = 0.005 + 0.001 * 8  # one request fewer in the batch would be 12 % off
    # the first request, routed alone, runs one step before the others join: within 1 %
    assert [t.tpot_s for t in times] == pytest.approx([step_s] * 8, rel=0.01)


@pytest.mark.parametrize("per_seq_step_s", [0.0003, -0.0005], ids=["steeper", "flatter"])
def test_the_per_request_overhead_changes_a_steps_slope_beyond_the_first_request(per_seq_step_s):
    serving = ServingOverhead(step_s=0.002, per_seq_step_s=per_seq_step_s)
    profile = make_profile(prefill=PrefillFit(1e-6, 0.0, 0.0), transfer_gb_per_s=1e12, serving=serving)
    times = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 16, 101) for _ in range(8)])
    step_s = 0.005 + 0.001 * 8 + 0.002 + per_seq_step_s * 7
    assert [t.tpot_s for t in times] == pytest.approx([step_s] * 8, rel=0.01)


def test_decode_servers_share_a_burst_so_each_steps_a_smaller_batch():
    profile = make_profile(prefill=PrefillFit(1e-6, 0.0, 0.0), transfer_gb_per_s=1e12)
    requests = [SimRequest(0.0, 16, 101) for _ in range(8)]
    times = Simulation(profile, XpYd(1, 2)).run(requests)
    assert [t.tpot_s for t in times] == pytest.approx([0.005 + 0.001 * 4] * 8, rel=0.01)


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks():
    profile = make_profile(max_num_batched_tokens=100)
    [times] = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 250, 1)])
    assert times.ttft_s == pytest.approx(3 * 0.010 + 0.0001 * 250)


def test_prompts_that_wait_together_share_one_prefill_step():
    profile = make_profile()
    times = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 100, 1), SimRequest(0.001, 100, 1),
                                                 SimRequest(0.002, 100, 1)])
    first_step_s = 0.010 + 0.0001 * 100
    second_step_s = 0.010 + 0.0001 * 200  # the two that arrived during the first step
    assert times[0].first_token_s == pytest.approx(first_step_s)
    assert times[1].first_token_s == times[2].first_token_s == pytest.approx(first_step_s + second_step_s)


def _mean_prefill_wait_s(profile, rate: float, num_requests: int = 20000) -> float:
    rng = np.random.default_rng(0)
    arrivals_s = np.cumsum(rng.exponential(1 / rate, num_requests))
    requests = [SimRequest(float(t), 100, 1) for t in arrivals_s]
    times = Simulation(profile, ONE_TO_ONE).run(requests)
    service_s = profile.prefill.step_s([(0, 100)])
    return float(np.mean([t.ttft_s for t in times])) - service_s


def test_prefill_queueing_of_unbatched_prompts_is_m_d_1():
    # The budget holds one prompt, so each is served alone in a fixed time: an M/D/1 queue,
    # whose mean wait is rho * S / (2 * (1 - rho)) (Pollaczek-Khinchine).
    profile = make_profile(max_num_batched_tokens=100)
    service_s = profile.prefill.step_s([(0, 100)])
    for rho in (0.3, 0.6, 0.8):
        expected_s = rho * service_s / (2 * (1 - rho))
        assert _mean_prefill_wait_s(profile, rho / service_s) == pytest.approx(expected_s, rel=0.1)


def test_a_second_prefill_server_cuts_the_queueing():
    profile = make_profile(max_num_batched_tokens=100)
    rate = 0.8 / profile.prefill.step_s([(0, 100)])
    requests = Workload(rate, 3000, 100, 1).requests()
    one = simulate(profile, XpYd(1, 1), requests, Slo(1000, 1000)).ttft_ms[90]
    two = simulate(profile, XpYd(2, 1), requests, Slo(1000, 1000)).ttft_ms[90]
    assert two < 0.7 * one


def test_the_gateway_serialises_requests_before_prefill():
    profile = make_profile(serving=ServingOverhead(gateway_s=0.05))
    times = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 10, 1) for _ in range(3)])
    # the second and third reach prefill 50 and 100 ms after the first, each alone in its step
    step_s = 0.010 + 0.0001 * 10
    assert [t.ttft_s for t in times] == pytest.approx([0.05 + step_s, 0.10 + step_s, 0.15 + step_s])
    three_gateways = Simulation(profile, ONE_TO_ONE, num_gateways=3).run([SimRequest(0.0, 10, 1) for _ in range(3)])
    # all reach prefill at 50 ms: the first starts a step alone, the other two share the next
    shared_s = 0.05 + step_s + 0.012
    assert [t.ttft_s for t in three_gateways] == pytest.approx([0.05 + step_s, shared_s, shared_s])


def test_goodput_counts_requests_within_both_slos():
    profile = make_profile(prefill=PrefillFit(0.010, 0.0, 0.0), decode=DecodeFit(0.020, 0.0, 0.0))
    requests = [SimRequest(float(i), 10, 11) for i in range(10)]
    assert simulate(profile, ONE_TO_ONE, requests, Slo(ttft_ms=11, tpot_ms=21)).slo_attainment == 1.0
    assert simulate(profile, ONE_TO_ONE, requests, Slo(ttft_ms=9, tpot_ms=21)).slo_attainment == 0.0
    assert simulate(profile, ONE_TO_ONE, requests, Slo(ttft_ms=11, tpot_ms=19)).slo_attainment == 0.0


def test_the_simulation_is_a_pure_function_of_its_inputs():
    requests = Workload(20, 300, 200, 30, range_ratio=0.5, seed=3).requests()
    first = simulate(make_profile(), XpYd(2, 3), requests, Slo(200, 20))
    assert simulate(make_profile(), XpYd(2, 3), requests, Slo(200, 20)) == first


def test_a_configuration_needs_both_kinds_of_server():
    with pytest.raises(ValueError):
        XpYd(0, 2)
    assert str(XpYd(3, 5)) == "3P5D" and XpYd(3, 5).num_gpus == 8


def _with_spreads(profile, prefill_timings_s, decode_timings_s, ttft_delays_s, handoff_residuals_s):
    """`profile` with one measured point of each kind whose repeats are these timings."""
    fields = {f: getattr(profile, f) for f in Profile.__dataclass_fields__}
    serving = dataclasses.replace(profile.serving, ttft_delays_s=ttft_delays_s,
                                  handoff_residuals_s=handoff_residuals_s)
    return Profile(**{**fields, "serving": serving,
                      "prefill_samples": [PrefillSample(1, 16, float(np.median(prefill_timings_s)), prefill_timings_s)],
                      "decode_samples": [DecodeSample(1, 16, float(np.median(decode_timings_s)), decode_timings_s)]})


SERVED = make_profile(serving=ServingOverhead(gateway_s=0.002, ttft_s=0.003, handoff_s=0.004, step_s=0.0005))
LIGHT_LOAD = Workload(5, 400, 100, 20, range_ratio=0.3, seed=1).requests()


def test_spreads_of_neutral_values_give_the_median_models_answers_for_any_seed():
    flat = _with_spreads(SERVED, [0.01] * 5, [0.004] * 5, [0.0] * 20, [0.0] * 20)
    expected = Simulation(SERVED, ONE_TO_ONE).run(LIGHT_LOAD)
    assert Simulation(flat, ONE_TO_ONE, seed=7).run(LIGHT_LOAD) == expected


def test_measured_spreads_widen_the_tails_and_the_seed_fixes_the_draws():
    spread = _with_spreads(SERVED, [0.008, 0.01, 0.02], [0.003, 0.004, 0.008], [-0.002, 0.0, 0.03],
                           [-0.002, 0.0, 0.01])
    requests = [SimRequest(float(i), 100, 20) for i in range(200)]  # alone, each the same
    flat = simulate(SERVED, ONE_TO_ONE, requests, SLO_LOOSE)
    assert flat.ttft_ms[90] == pytest.approx(flat.ttft_ms[50]) and flat.tpot_ms[90] == pytest.approx(flat.tpot_ms[50])
    jittered = simulate(spread, ONE_TO_ONE, requests, SLO_LOOSE, seed=3)
    assert jittered.ttft_ms[90] > 1.2 * jittered.ttft_ms[50]
    assert jittered.tpot_ms[90] > 1.05 * jittered.tpot_ms[50]
    assert simulate(spread, ONE_TO_ONE, requests, SLO_LOOSE, seed=3) == jittered
    assert simulate(spread, ONE_TO_ONE, requests, SLO_LOOSE, seed=4) != jittered


SHARED = CpuSharing(True, front=CpuDemand(idle_s_per_s=0.2, per_request_s=0.04),
                    prefill=CpuDemand(per_request_s=0.005), decode=CpuDemand(per_output_token_s=2e-4))


def test_a_request_alone_on_shared_cpus_loses_only_what_its_own_replica_runs_beside_its_steps():
    # the front's work floats to an idle core; the decode replica's 0.5 ms of streaming per step
    # runs on its engine's core, so each step takes that much longer
    sharing = dataclasses.replace(SHARED, decode=CpuDemand(per_decode_step_s=0.0005))
    serving = ServingOverhead(gateway_s=0.002, ttft_s=0.003, handoff_s=0.004, cpu=sharing)
    profile = make_profile(decode=DecodeFit(0.005, 0.001, 1e-6), serving=serving)
    [times] = Simulation(profile, ONE_TO_ONE).run([SimRequest(1.0, 100, 5)])

    prefill_s = 0.010 + 0.0001 * 100
    assert times.ttft_s == pytest.approx(0.002 + prefill_s + 0.003)
    steps_s = sum(0.005 + 0.001 + 1e-6 * (100 + generated) for generated in range(1, 5))
    assert times.finish_s - times.first_token_s == pytest.approx(0.004 + 100 * 1000 / 1e9 + steps_s + 4 * 0.0005)

    unshared = dataclasses.replace(serving, cpu=dataclasses.replace(sharing, shares_replica_cpus=False))
    [times] = Simulation(make_profile(decode=profile.decode, serving=unshared), ONE_TO_ONE).run([SimRequest(1.0, 100, 5)])
    assert times.finish_s - times.first_token_s == pytest.approx(0.004 + 100 * 1000 / 1e9 + steps_s)


def test_front_work_that_lands_while_both_engines_step_slows_them_both():
    # 2 ms of gateway work beside two busy engines: the three share the two cores at 2/3 each,
    # so it takes 3 ms and each engine loses 1 ms; beside one busy engine it takes the idle core
    serving = ServingOverhead(gateway_s=0.002, cpu=CpuSharing(True))
    profile = make_profile(prefill=PrefillFit(0.050, 0.0, 0.0), decode=DecodeFit(0.1, 0.0, 0.0), serving=serving)
    requests = [SimRequest(0.0, 10, 3), SimRequest(0.060, 10, 1), SimRequest(0.170, 10, 1)]
    first, second, third = Simulation(profile, ONE_TO_ONE).run(requests)
    landed_s = 0.052 + 10 * 1000 / 1e9  # the first: gateway alone, prefill, then two 100 ms decode steps
    # the second's gateway work (60-62 ms) runs beside the decode step alone; it reserves at the
    # step's end and prefills then, with the third's gateway work (170-173 ms) beside
    assert second.ttft_s == pytest.approx(landed_s + 0.1 + 0.050 + 0.001 - 0.060)
    assert first.finish_s == pytest.approx(landed_s + 2 * 0.1 + 0.001)
    assert third.ttft_s == pytest.approx(first.finish_s + 0.050 - 0.170)


def test_the_summary_carries_the_fronts_cpu_at_what_the_run_served():
    requests = [SimRequest(0.1 * i, 100, 3) for i in range(50)]
    profile = make_profile(serving=ServingOverhead(cpu=SHARED))
    summary = simulate(profile, ONE_TO_ONE, requests, SLO_LOOSE)
    requests_per_s = 50 / summary.duration_s
    assert summary.front_cpu_s_per_s == pytest.approx(0.2 + 0.04 * requests_per_s)


def test_a_busy_decode_reserves_for_a_new_request_when_its_step_ends():
    profile = make_profile(decode=DecodeFit(0.05, 0.0, 0.0))
    first, second = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 100, 10), SimRequest(0.05, 100, 2)])
    prefill_s = 0.010 + 0.0001 * 100
    landed_s = prefill_s + 100 * 1000 / 1e9  # the first request's KV, when its first decode step starts
    assert first.ttft_s == pytest.approx(prefill_s)
    reserved_s = landed_s + 0.05  # the end of that step, which the second request (sent at 0.05) waits for
    assert second.ttft_s == pytest.approx(reserved_s + prefill_s - 0.05)


def test_a_request_joining_decode_adds_its_join_to_that_step():
    profile = make_profile(decode=DecodeFit(0.005, 0.001, 0.0, per_join_s=0.004))
    [times] = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 100, 4)])
    steps_s = 3 * (0.005 + 0.001) + 0.004  # the join in the first step only
    assert times.finish_s - times.first_token_s == pytest.approx(100 * 1000 / 1e9 + steps_s)
