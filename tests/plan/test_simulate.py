"""The xPyD model: a request's TTFT and TPOT from its own steps, batching, queueing and chunking
as the engine does them, goodput as bench computes it, and no clock or randomness of its own."""
import numpy as np
import pytest

from pdserve.bench.metrics import tpot_s
from pdserve.planner.profile import DecodeFit, PrefillFit
from pdserve.planner.simulate import SimRequest, Simulation, Workload, XpYd, simulate

from tests.plan.profiles import make_profile

ONE_TO_ONE = XpYd(1, 1)


def slos_ms(ttft_ms: float, tpot_ms: float) -> dict[str, float]:
    return {"ttft": ttft_ms, "tpot": tpot_ms}


def test_a_request_alone_waits_for_nothing_but_its_own_steps_and_its_kv_transfer():
    profile = make_profile(decode=DecodeFit(0.005, 0.001, 1e-6))
    [record] = Simulation(profile, ONE_TO_ONE).run([SimRequest(1.0, 100, 5)])
    assert record.start_s == 1.0 and record.ttft_s == pytest.approx(0.010 + 0.0001 * 100)
    transfer_s = 100 * 1000 / 1e9
    steps_s = sum(0.005 + 0.001 + 1e-6 * (100 + generated) for generated in range(1, 5))
    assert record.e2el_s - record.ttft_s == pytest.approx(transfer_s + steps_s)


def test_a_one_token_request_ends_at_its_first_token():
    [record] = Simulation(make_profile(), ONE_TO_ONE).run([SimRequest(0.0, 50, 1)])
    assert record.e2el_s == record.ttft_s and tpot_s(record) == 0.0


def test_a_burst_decodes_as_one_batch_so_tpot_is_the_step_time_at_that_batch():
    profile = make_profile(prefill=PrefillFit(1e-6, 0.0, 0.0), transfer_gb_per_s=1e12)
    requests = [SimRequest(0.0, 16, 101) for _ in range(8)]
    times = Simulation(profile, ONE_TO_ONE).run(requests)
    step_s = 0.005 + 0.001 * 8  # one request fewer in the batch would be 12 % off
    # the first request, routed alone, runs one step before the others join: within 1 %
    assert [tpot_s(t) for t in times] == pytest.approx([step_s] * 8, rel=0.01)


def test_decode_servers_share_a_burst_so_each_steps_a_smaller_batch():
    profile = make_profile(prefill=PrefillFit(1e-6, 0.0, 0.0), transfer_gb_per_s=1e12)
    requests = [SimRequest(0.0, 16, 101) for _ in range(8)]
    times = Simulation(profile, XpYd(1, 2)).run(requests)
    assert [tpot_s(t) for t in times] == pytest.approx([0.005 + 0.001 * 4] * 8, rel=0.01)


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks():
    profile = make_profile(max_num_batched_tokens=100)
    [record] = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 250, 1)])
    assert record.ttft_s == pytest.approx(3 * 0.010 + 0.0001 * 250)


def test_prompts_that_wait_together_share_one_prefill_step():
    profile = make_profile()
    times = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 100, 1), SimRequest(0.001, 100, 1),
                                                 SimRequest(0.002, 100, 1)])
    first_step_s = 0.010 + 0.0001 * 100
    second_step_s = 0.010 + 0.0001 * 200  # the two that arrived during the first step
    assert [t.start_s + t.ttft_s for t in times] == pytest.approx([first_step_s] + [first_step_s + second_step_s] * 2)


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
    one = simulate(profile, XpYd(1, 1), requests, slos_ms(1000, 1000))["p90_ttft_ms"]
    two = simulate(profile, XpYd(2, 1), requests, slos_ms(1000, 1000))["p90_ttft_ms"]
    assert two < 0.7 * one


def test_goodput_counts_requests_within_both_slos():
    profile = make_profile(prefill=PrefillFit(0.010, 0.0, 0.0), decode=DecodeFit(0.020, 0.0, 0.0))
    requests = [SimRequest(float(i), 10, 11) for i in range(10)]
    met = simulate(profile, ONE_TO_ONE, requests, slos_ms(11, 21))
    assert met["slo_attainment"] == 1.0 and met["request_goodput"] == pytest.approx(10 / met["duration"])
    assert simulate(profile, ONE_TO_ONE, requests, slos_ms(9, 21))["slo_attainment"] == 0.0
    assert simulate(profile, ONE_TO_ONE, requests, slos_ms(11, 19))["slo_attainment"] == 0.0


def test_the_simulation_is_a_pure_function_of_its_inputs():
    requests = Workload(20, 300, 200, 30, range_ratio=0.5, seed=3).requests()
    first = simulate(make_profile(), XpYd(2, 3), requests, slos_ms(200, 20))
    assert simulate(make_profile(), XpYd(2, 3), requests, slos_ms(200, 20)) == first


def test_a_configuration_needs_both_kinds_of_server():
    with pytest.raises(ValueError):
        XpYd(0, 2)
    assert str(XpYd(3, 5)) == "3P5D" and XpYd.parse(" 3p5d") == XpYd(3, 5)


def test_a_busy_decode_reserves_for_a_new_request_when_its_step_ends():
    profile = make_profile(decode=DecodeFit(0.05, 0.0, 0.0))
    first, second = Simulation(profile, ONE_TO_ONE).run([SimRequest(0.0, 100, 10), SimRequest(0.05, 100, 2)])
    prefill_s = 0.010 + 0.0001 * 100
    landed_s = prefill_s + 100 * 1000 / 1e9  # the first request's KV, when its first decode step starts
    assert first.ttft_s == pytest.approx(prefill_s)
    reserved_s = landed_s + 0.05  # the end of that step, which the second request (sent at 0.05) waits for
    assert second.ttft_s == pytest.approx(reserved_s + prefill_s - 0.05)
