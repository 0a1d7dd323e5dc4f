"""The speed probe reads a window's reference time off an engine; `at_speed` scales every
duration of a profile by the ratio of reference times and nothing else."""
import dataclasses
from pathlib import Path

import pytest

from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.profile import DecodeFit, PrefillFit, PrefillSample, ServingOverhead
from pdserve.planner.speed import SpeedProbe, at_speed

from tests.plan.profiles import make_profile


def test_the_probe_times_the_engines_step_pair_for_each_window_read(tiny_model):
    with SpeedProbe(Path(tiny_model()), window_s=0.2) as probe:
        readings_s = [probe.read_s(), probe.read_s()]
    assert all(0 < reading_s < 1.0 for reading_s in readings_s)
    assert probe._process.returncode == 0  # gone when its pipe closed


def test_a_probe_that_cannot_load_its_engine_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="no engine"):
        with SpeedProbe(tmp_path):
            pass


def test_a_profile_at_twice_its_reference_time_takes_twice_as_long_for_everything():
    sharing = CpuSharing(True, front=CpuDemand(0.01, 0.02, 0.003, 0.004), prefill=CpuDemand(0.0, 0.005),
                         decode=CpuDemand(0.001, 0.002, 0.0, 0.0003))
    serving = ServingOverhead(gateway_s=0.003, ttft_s=0.004, handoff_s=0.01, step_s=0.001, per_seq_step_s=-2e-4,
                              ttft_delays_s=[-0.001, 0.005], handoff_residuals_s=[-0.001, 0.002], cpu=sharing)
    profile = make_profile(prefill=PrefillFit(0.01, 1e-4, 1e-8), decode=DecodeFit(0.005, 0.001, 1e-6, 0.002),
                           serving=serving, transfer_gb_per_s=4.0)
    profile = dataclasses.replace(profile, hardware={**profile.hardware, "reference_s": 0.0015})

    slower = at_speed(profile, 0.003)
    assert dataclasses.astuple(slower.prefill) == pytest.approx((0.02, 2e-4, 2e-8))
    assert dataclasses.astuple(slower.decode) == pytest.approx((0.01, 0.002, 2e-6, 0.004))
    assert (slower.serving.gateway_s, slower.serving.ttft_s, slower.serving.handoff_s, slower.serving.step_s,
            slower.serving.per_seq_step_s) == pytest.approx((0.006, 0.008, 0.02, 0.002, -4e-4))
    assert slower.serving.handoff_residuals_s == pytest.approx([-0.002, 0.004])
    assert slower.serving.ttft_delays_s == pytest.approx([-0.002, 0.01])
    assert dataclasses.astuple(slower.serving.cpu.front) == pytest.approx((0.02, 0.04, 0.006, 0.008))
    assert dataclasses.astuple(slower.serving.cpu.decode) == pytest.approx((0.002, 0.004, 0.0, 0.0006))
    assert slower.serving.cpu.shares_replica_cpus
    assert slower.transfer_gb_per_s == pytest.approx(2.0)
    assert slower.hardware == profile.hardware  # still the profile's own machine and reference


def test_a_profile_at_twice_its_reference_time_served_and_stepped_twice_as_slowly():
    profile = make_profile(serving=ServingOverhead(samples=[
        {"kind": "wave", "start_s": 0.5, "prompt_len": 64, "output_len": 8, "ttft_s": 0.02, "e2el_s": 0.1}]))
    profile = dataclasses.replace(profile, hardware={**profile.hardware, "reference_s": 0.0015},
                                  prefill_samples=[PrefillSample(1, 64, 0.01, [0.01, 0.012])])
    slower = at_speed(profile, 0.003)
    assert slower.serving.samples == [pytest.approx(
        {"kind": "wave", "start_s": 0.5, "prompt_len": 64, "output_len": 8, "ttft_s": 0.04, "e2el_s": 0.2})]
    assert slower.prefill_samples[0].timings_s == pytest.approx([0.02, 0.024])
    assert slower.prefill_samples[0].step_s == pytest.approx(0.02)


def test_a_profile_without_a_reference_time_is_left_as_it_is():
    profile = make_profile()
    assert at_speed(profile, 0.003) is profile
