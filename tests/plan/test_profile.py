import json

import pytest

from pdserve.planner.profile import DecodeFit, DecodeSample, PrefillFit, PrefillSample, Profile, fit_linear

from tests.plan.profiles import make_profile


def test_the_prefill_fit_recovers_the_coefficients_it_was_sampled_from():
    truth = PrefillFit(0.004, 5e-5, 2e-8)
    samples = [PrefillSample(n, length, truth.step_s([(0, length)] * n))
               for n in (1, 2, 4) for length in (16, 128, 512, 1024)]
    fit = PrefillFit.fit(samples)
    assert fit.intercept_s == pytest.approx(truth.intercept_s, rel=1e-6)
    assert fit.per_token_s == pytest.approx(truth.per_token_s, rel=1e-6)
    assert fit.per_attention_pair_s == pytest.approx(truth.per_attention_pair_s, rel=1e-6)


def test_the_decode_fit_recovers_batch_and_context_terms():
    truth = DecodeFit(0.003, 2e-4, 1e-7)
    samples = [DecodeSample(n, n * context, truth.step_s(n, n * context)) for n in (1, 8, 32) for context in (64, 1024)]
    fit = DecodeFit.fit(samples)
    assert (fit.intercept_s, fit.per_seq_s, fit.per_context_token_s) == pytest.approx(
        (truth.intercept_s, truth.per_seq_s, truth.per_context_token_s), rel=1e-6)


def test_a_term_that_would_come_out_negative_is_dropped_and_the_rest_refitted():
    # step times that fall with context: the context term would be negative
    samples = [DecodeSample(1, 100, 0.010), DecodeSample(1, 1000, 0.009), DecodeSample(8, 800, 0.012),
               DecodeSample(8, 8000, 0.011)]
    fit = DecodeFit.fit(samples)
    assert fit.per_context_token_s == 0.0
    assert fit.intercept_s > 0 and fit.per_seq_s > 0


def test_the_fit_minimises_relative_error_so_short_steps_are_not_swamped():
    coefficients = fit_linear([[1.0, 1.0], [1.0, 1000.0], [1.0, 1001.0]], [0.001, 1.0, 1.0012])
    assert coefficients[0] + coefficients[1] == pytest.approx(0.001, rel=0.05)


def test_fit_linear_refuses_non_positive_times():
    with pytest.raises(ValueError):
        fit_linear([[1.0]], [0.0])


def test_a_profile_survives_its_json_round_trip(tmp_path):
    profile = make_profile()
    profile = Profile(**{**{f: getattr(profile, f) for f in profile.__dataclass_fields__},
                         "prefill_samples": [PrefillSample(2, 64, 0.01)],
                         "decode_samples": [DecodeSample(4, 400, 0.005)]})
    path = profile.save(tmp_path / "profile.json")
    assert Profile.load(path) == profile
    assert json.loads(path.read_text())["schema_version"] == 6


def test_a_profile_of_an_earlier_schema_is_refused_with_what_to_do(tmp_path):
    data = make_profile().to_json_dict()
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**data, "schema_version": 5}))
    with pytest.raises(ValueError, match="schema 5, expected 6.*pdserve plan profile"):
        Profile.load(path)


def test_transfer_time_is_bytes_over_bandwidth():
    assert make_profile(transfer_gb_per_s=2.0, kv_bytes_per_token=4096).transfer_s(1000) == pytest.approx(
        1000 * 4096 / 2e9)
