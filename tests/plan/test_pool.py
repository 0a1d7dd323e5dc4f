"""Pooling profiles: each figure the median of the profiles' own at one reference speed, each
spread their union; profiles of another model or machine are refused."""
import dataclasses

import pytest

from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.pool import pool
from pdserve.planner.profile import DecodeFit, DecodeSample, PrefillFit, Profile, ServingOverhead

from tests.plan.profiles import make_profile


def _profile(reference_s: float, prefill_intercept_s: float, per_seq_s: float, gateway_s: float,
             front_per_request_s: float, delays_s: list[float]) -> Profile:
    serving = ServingOverhead(gateway_s=gateway_s, ttft_delays_s=delays_s,
                              cpu=CpuSharing(True, front=CpuDemand(0.01, front_per_request_s)),
                              samples=[{"kind": "single", "prompt_len": 64, "output_len": 8, "ttft_s": gateway_s * 10,
                                        "e2el_s": 0.1}])
    profile = make_profile(prefill=PrefillFit(prefill_intercept_s, 1e-4, 0.0), decode=DecodeFit(0.005, per_seq_s, 0.0),
                           serving=serving, transfer_gb_per_s=4.0)
    return dataclasses.replace(profile, hardware={**profile.hardware, "reference_s": reference_s},
                               decode_samples=[DecodeSample(1, 64, 0.005, [0.005, 0.006])])


def test_each_figure_is_the_median_of_the_profiles_at_the_pools_reference_speed():
    # the second profile was made while the machine ran twice as slow: at the pool's reference
    # (the median, 0.01 s) its figures count at half
    profiles = [_profile(0.01, 0.010, 3e-4, 0.001, 0.010, [0.001]),
                _profile(0.02, 0.030, 6e-4, 0.004, 0.040, [0.004]),
                _profile(0.01, 0.012, 2e-4, 0.003, 0.016, [0.003])]
    pooled = pool(profiles, ["a", "b", "c"])
    assert pooled.hardware["reference_s"] == 0.01
    assert pooled.prefill.intercept_s == pytest.approx(0.012)  # of 0.010, 0.015, 0.012
    assert pooled.decode.per_seq_s == pytest.approx(3e-4)  # of 3e-4, 3e-4, 2e-4
    assert pooled.decode.intercept_s == pytest.approx(0.005)  # of 0.005, 0.0025, 0.005
    assert pooled.serving.gateway_s == pytest.approx(0.002)  # of 0.001, 0.002, 0.003
    assert pooled.serving.cpu.front.per_request_s == pytest.approx(0.016)  # of 0.010, 0.020, 0.016
    assert pooled.transfer_gb_per_s == pytest.approx(4.0)  # of 4, 8, 4
    assert pooled.hardware["pooled_from"] == [{"source": s, "reference_s": r}
                                              for s, r in zip("abc", (0.01, 0.02, 0.01))]


def test_spreads_and_served_requests_are_the_union_of_the_profiles_at_the_pools_speed():
    profiles = [_profile(0.01, 0.010, 3e-4, 0.001, 0.010, [0.001, -0.001]),
                _profile(0.02, 0.030, 6e-4, 0.004, 0.040, [0.004])]
    pooled = pool(profiles, ["a", "b"])  # reference 0.015: a at 1.5 times, b at 0.75
    assert pooled.serving.ttft_delays_s == pytest.approx([0.0015, -0.0015, 0.003])
    assert [s["ttft_s"] for s in pooled.serving.samples] == pytest.approx([0.015, 0.03])
    assert len(pooled.decode_samples) == 2
    assert pooled.decode_step_ratios == pytest.approx(profiles[0].decode_step_ratios * 2)  # not changed by speed


def test_one_profile_far_off_does_not_move_the_pooled_figure_out_of_the_others_range():
    profiles = [_profile(0.01, 0.010, 3e-4, 0.001, 0.01, []), _profile(0.01, 0.011, 3.2e-4, 0.001, 0.01, []),
                _profile(0.01, 0.090, 9e-3, 0.001, 0.01, [])]
    pooled = pool(profiles, ["a", "b", "c"])
    assert pooled.prefill.intercept_s == 0.011 and pooled.decode.per_seq_s == 3.2e-4


def test_a_pool_of_one_profile_has_its_figures():
    profile = _profile(0.01, 0.010, 3e-4, 0.001, 0.010, [0.001])
    pooled = pool([profile], ["a"])
    assert dataclasses.replace(pooled, hardware=profile.hardware) == profile


def test_a_pooled_profile_survives_its_json_round_trip(tmp_path):
    pooled = pool([_profile(0.01, 0.010, 3e-4, 0.001, 0.010, [0.001]),
                   _profile(0.02, 0.030, 6e-4, 0.004, 0.040, [0.004])], ["a", "b"])
    assert Profile.load(pooled.save(tmp_path / "pooled.json")) == pooled


def test_profiles_of_another_model_or_machine_are_refused():
    profile = _profile(0.01, 0.010, 3e-4, 0.001, 0.010, [])
    other_model = dataclasses.replace(profile, model={"dir": "other", "num_layers": 2})
    with pytest.raises(ValueError, match="another model, machine or engine"):
        pool([profile, other_model], ["a", "b"])
    other_cpu = dataclasses.replace(profile, hardware={**profile.hardware, "name": "another CPU"})
    with pytest.raises(ValueError, match="another model, machine or engine"):
        pool([profile, other_cpu], ["a", "b"])
    same_model_elsewhere = dataclasses.replace(profile, model={"dir": "copied"})
    assert pool([profile, same_model_elsewhere], ["a", "b"]).model == profile.model


def test_profiles_with_and_without_a_reference_time_are_refused():
    profile = _profile(0.01, 0.010, 3e-4, 0.001, 0.010, [])
    without = dataclasses.replace(profile, hardware={"device": "cpu", "name": "test"})
    with pytest.raises(ValueError, match="reference time"):
        pool([profile, without], ["a", "b"])
