"""The serving-overhead estimator, fed records that the simulation produced from known overheads."""
import dataclasses

import pytest

from pdserve.bench.records import RequestRecord
from pdserve.planner.profile import DecodeFit, PrefillFit, ServingOverhead
from pdserve.planner.serving import overhead_from_records
from pdserve.planner.simulate import Simulation, XpYd
from pdserve.planner.workload import SimRequest

from tests.plan.profiles import make_profile

TRUTH = ServingOverhead(gateway_s=0.008, ttft_s=0.006, handoff_s=0.012, step_s=0.0015, per_seq_step_s=0.0003)


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


def test_the_overheads_are_recovered_from_single_requests_and_waves():
    engine = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7))
    served = dataclasses.replace(engine, serving=TRUTH)
    singles, waves, staggered = _runs(served)

    measured = overhead_from_records(engine, singles, waves, staggered)
    assert measured.step_s == pytest.approx(TRUTH.step_s, rel=0.05)
    assert measured.handoff_s == pytest.approx(TRUTH.handoff_s, rel=0.05)
    assert measured.gateway_s + measured.ttft_s == pytest.approx(TRUTH.gateway_s + TRUTH.ttft_s, rel=0.01)
    assert measured.gateway_s == pytest.approx(TRUTH.gateway_s, rel=0.25)
    assert measured.per_seq_step_s == pytest.approx(TRUTH.per_seq_step_s, rel=0.05)
    # the requests they were read from are kept with them
    assert [s["kind"] for s in measured.samples].count("single") == 12
    assert len(measured.samples) == 12 + (16 + 16 + 4) + 2 * 24


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
