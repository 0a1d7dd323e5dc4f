"""The serving-overhead estimator, fed records that the simulation produced from known overheads."""
import dataclasses
import statistics

import pytest

from pdserve.bench.records import RequestRecord
from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.profile import DecodeFit, PrefillFit, ServingOverhead
from pdserve.planner.serving import overhead_from_records, served_decode_fit, served_prefill_fit
from pdserve.planner.simulate import Simulation, XpYd
from pdserve.planner.workload import SimRequest

from tests.plan.profiles import make_profile

TRUTH = ServingOverhead(gateway_s=0.008, ttft_s=0.006, handoff_s=0.012, step_s=0.0015, per_seq_step_s=0.0003)
SHARING = CpuSharing(True, front=CpuDemand(per_request_s=0.02, per_decode_step_s=0.0004),
                     prefill=CpuDemand(per_request_s=0.002), decode=CpuDemand(per_request_s=0.001, per_decode_step_s=0.0002))


def _records(profile, requests):
    return _as_records(requests, Simulation(profile, XpYd(1, 1)).run(requests))


def _as_records(requests, times):
    return [RequestRecord(prompt_len=r.prompt_len, output_len=r.output_len, ttft_s=t.ttft_s, itl_s=[],
                          e2el_s=t.finish_s - t.arrival_s, success=True, error="", start_s=r.arrival_s)
            for r, t in zip(requests, times)]


def _runs(served):
    """Single requests one at a time, three per run, waves of two shapes and staggered runs of
    two, as the profile runs them; each run's records timed from its own start."""
    singles = [_records(served, [SimRequest(10.0 * i, prompt_len, output_len) for i in range(3)])
               for prompt_len, output_len in [(64, 8), (64, 64), (512, 8), (512, 64)]]
    waves = [_records(served, [SimRequest(0.0, prompt_len, output_len) for _ in range(batch_size)])
             for batch_size, prompt_len, output_len in [(16, 64, 64), (16, 64, 64), (4, 64, 128)]]
    staggered = [_records(served, [SimRequest(gap_s * i, prompt_len, 64) for i in range(24)])
                 for gap_s, prompt_len in [(0.2, 512), (0.1, 64)]]
    return singles, waves, staggered


@pytest.mark.parametrize("sharing", [CpuSharing(), SHARING], ids=["own cores", "shared cores"])
def test_the_overheads_are_recovered_from_single_requests_and_waves(sharing):
    engine = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7),
                          serving=ServingOverhead(cpu=sharing))
    served = dataclasses.replace(engine, serving=dataclasses.replace(TRUTH, cpu=sharing))
    singles, waves, staggered = _runs(served)

    measured = overhead_from_records(engine, singles, waves, staggered)
    assert measured.step_s == pytest.approx(TRUTH.step_s, rel=0.05)
    assert measured.handoff_s == pytest.approx(TRUTH.handoff_s, rel=0.05)
    assert measured.gateway_s + measured.ttft_s == pytest.approx(TRUTH.gateway_s + TRUTH.ttft_s, rel=0.01)
    assert measured.gateway_s == pytest.approx(TRUTH.gateway_s, rel=0.25)
    assert measured.per_seq_step_s == pytest.approx(TRUTH.per_seq_step_s, rel=0.05)
    assert measured.cpu == sharing
    # a system without jitter shows no spread
    # nor a light load's TTFT beyond the model (the gateway's share of the idle overhead, read
    # within 25 %, moves the staggered requests' queueing a little)
    assert statistics.median(measured.ttft_delays_s) == pytest.approx(0.0, abs=0.1 * (TRUTH.gateway_s + TRUTH.ttft_s))
    assert measured.handoff_residuals_s == pytest.approx([0.0] * 12, abs=1e-9)


@pytest.mark.parametrize("per_seq_step_s", [-1.5e-4, -2e-4], ids=["flatter", "flat"])
def test_a_served_step_that_grows_more_slowly_than_the_engines_fit_is_read_as_such(per_seq_step_s):
    engine = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7))
    served = dataclasses.replace(engine, serving=dataclasses.replace(TRUTH, per_seq_step_s=per_seq_step_s))
    measured = overhead_from_records(engine, *_runs(served))
    assert measured.per_seq_step_s == pytest.approx(per_seq_step_s, rel=0.05)


def test_the_gateway_is_read_from_the_waves_it_paces_and_only_bounded_by_the_others():
    # long prompts: such a wave's TTFTs climb by a prefill step per request, not by the gateway
    engine = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7))
    served = dataclasses.replace(engine, serving=TRUTH)
    singles, waves, staggered = _runs(served)
    long_prompts = _records(served, [SimRequest(0.0, 2048, 16) for _ in range(8)])
    assert overhead_from_records(engine, singles, [long_prompts, *waves], staggered).gateway_s == pytest.approx(
        TRUTH.gateway_s, rel=0.25)
    # alone, they only bound it: by the whole idle TTFT overhead, of which it is a part
    alone = overhead_from_records(engine, singles, [long_prompts], staggered)
    assert alone.gateway_s == pytest.approx(TRUTH.gateway_s + TRUTH.ttft_s) and alone.ttft_s == pytest.approx(0.0)


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
