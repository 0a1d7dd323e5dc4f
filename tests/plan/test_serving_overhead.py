"""The serving-overhead estimator, fed records that the simulation produced from known overheads."""
import dataclasses

import pytest

from bench.records import RequestRecord
from planner.cpu_sharing import CpuDemand, CpuSharing
from planner.profile import DecodeFit, PrefillFit, ServingOverhead
from planner.serving import overhead_from_records, served_decode_fit, served_prefill_fit, stretches_of
from planner.simulate import Simulation, XpYd
from planner.workload import SimRequest

from tests.plan.profiles import make_profile

TRUTH = ServingOverhead(gateway_s=0.008, ttft_s=0.006, handoff_s=0.012, step_s=0.0015, per_seq_step_s=0.0003)


def _records(profile, requests):
    return _as_records(requests, Simulation(profile, XpYd(1, 1)).run(requests))


def _as_records(requests, times):
    return [RequestRecord(prompt_len=r.prompt_len, output_len=r.output_len, ttft_s=t.ttft_s, itl_s=[],
                          e2el_s=t.finish_s - t.arrival_s, success=True, error="", start_s=r.arrival_s)
            for r, t in zip(requests, times)]


def test_the_overheads_are_recovered_from_single_requests_and_waves():
    engine = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7))
    served = make_profile(prefill=engine.prefill, decode=engine.decode, serving=TRUTH)
    singles = []
    for index, (prompt_len, output_len) in enumerate([(64, 8), (64, 64), (512, 8), (512, 64)] * 3):
        singles += _records(served, [SimRequest(10.0 * index, prompt_len, output_len)])
    waves = [_records(served, [SimRequest(0.0, 64, 64) for _ in range(16)])]

    measured = overhead_from_records(engine, singles, waves)
    assert measured.step_s == pytest.approx(TRUTH.step_s, rel=0.05)
    assert measured.handoff_s == pytest.approx(TRUTH.handoff_s, rel=0.05)
    assert measured.gateway_s + measured.ttft_s == pytest.approx(TRUTH.gateway_s + TRUTH.ttft_s, rel=0.01)
    assert measured.gateway_s == pytest.approx(TRUTH.gateway_s, rel=0.25)
    assert measured.per_seq_step_s == pytest.approx(TRUTH.per_seq_step_s, rel=0.25)
    # a system without jitter shows no spread
    assert measured.ttft_ratios == pytest.approx([1.0] * 12)
    assert measured.handoff_residuals_s == pytest.approx([0.0] * 12, abs=1e-9)



def test_the_overheads_are_recovered_beyond_the_steps_as_the_cpu_sharing_slows_them():
    engine = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7))
    sharing = CpuSharing(True, front=CpuDemand(idle_s_per_s=0.3, per_request_s=0.01))
    served = make_profile(prefill=engine.prefill, decode=engine.decode,
                          serving=dataclasses.replace(TRUTH, cpu=sharing))
    singles, single_stretches = [], []
    for index, (prompt_len, output_len) in enumerate([(64, 8), (64, 64), (512, 8), (512, 64)] * 3):
        simulation = Simulation(served, XpYd(1, 1))
        request = SimRequest(10.0 * index, prompt_len, output_len)
        [times] = simulation.run([request])
        singles += _as_records([request], [times])
        single_stretches.append(tuple(simulation.step_stretches))
    simulation = Simulation(served, XpYd(1, 1))
    wave = [SimRequest(0.0, 64, 64) for _ in range(16)]
    waves = [_as_records(wave, simulation.run(wave))]

    measured = overhead_from_records(engine, singles, waves, single_stretches, [tuple(simulation.step_stretches)])
    factors = [stretch for pair in single_stretches for stretch in pair]
    assert min(factors) > 1.0 and max(factors) > 1.2
    assert measured.step_s == pytest.approx(TRUTH.step_s, rel=0.05)
    assert measured.handoff_s == pytest.approx(TRUTH.handoff_s, rel=0.05)
    assert measured.gateway_s + measured.ttft_s == pytest.approx(TRUTH.gateway_s + TRUTH.ttft_s, rel=0.01)
    assert measured.per_seq_step_s == pytest.approx(TRUTH.per_seq_step_s, rel=0.25)
    assert stretches_of({"wall_s": 2.0, "cpu_s": {"prefill_engine": 0.4, "decode_engine": 1.0, "prefill": 0.2,
                                                  "decode": 0.2, "front": 0.6}}) == pytest.approx(
        (1 / (1 - 0.1 - 0.3 * 0.7 / 1.1), 1 / (1 - 0.1 - 0.3 * 0.4 / 1.1)))


def test_the_engine_as_served_is_refitted_to_its_threads_cpu():
    alone_decode, alone_prefill = DecodeFit(0.004, 2e-4, 1e-7), PrefillFit(0.004, 5e-5, 0.0)
    served = DecodeFit(0.003, 3e-4, 1e-7, per_join_s=0.002)
    readings = []
    for prompt_len, output_len, batch_size, num_steps in [(64, 8, 1, 70), (64, 64, 1, 630), (512, 8, 1, 70),
                                                          (512, 64, 1, 630), (64, 64, 16, 75), (64, 64, 16, 72)]:
        num_requests = 10 if batch_size == 1 else batch_size
        context_tokens = num_requests * sum(prompt_len + generated for generated in range(1, output_len))
        decode_s = (served.intercept_s * num_steps + served.per_seq_s * num_requests * (output_len - 1)
                    + served.per_context_token_s * context_tokens + served.per_join_s * num_requests)
        prefill_s = 1.3 * num_requests * alone_prefill.step_s([(0, prompt_len)])
        readings.append({"num_requests": num_requests, "batch_size": batch_size, "prompt_len": prompt_len,
                         "output_len": output_len, "num_decode_steps": num_steps,
                         "cpu_s": {"decode_engine": decode_s, "prefill_engine": prefill_s}})
    fit = served_decode_fit(alone_decode, readings)
    assert dataclasses.astuple(fit) == pytest.approx(dataclasses.astuple(served))
    prefill = served_prefill_fit(alone_prefill, readings)
    assert dataclasses.astuple(prefill) == pytest.approx((0.004 * 1.3, 5e-5 * 1.3, 0.0))
