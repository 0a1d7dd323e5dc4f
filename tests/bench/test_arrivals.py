"""Arrival schedules: the rate is kept on average, the seed fixes the schedule, inf sends at once."""
import math

import numpy as np
import pytest

from pdserve.bench.datasets import arrival_offsets_s
from pdserve.bench.errors import BenchConfigError


def test_gaps_are_poisson_with_a_mean_of_one_over_the_rate():
    offsets_s = arrival_offsets_s(20_001, request_rate=8.0, seed=3)
    gaps_s = np.diff(offsets_s)
    assert offsets_s[0] == 0.0
    assert np.all(gaps_s >= 0)
    assert gaps_s.mean() == pytest.approx(1 / 8.0, rel=0.03)
    assert gaps_s.std() / gaps_s.mean() == pytest.approx(1.0, rel=0.05)  # exponential: coefficient of variation 1


def test_same_seed_same_schedule_other_seed_other_schedule():
    assert arrival_offsets_s(50, 4.0, seed=7) == arrival_offsets_s(50, 4.0, seed=7)
    assert arrival_offsets_s(50, 4.0, seed=7) != arrival_offsets_s(50, 4.0, seed=8)


def test_infinite_rate_sends_everything_at_once():
    assert arrival_offsets_s(5, math.inf, seed=0) == [0.0] * 5


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan])
def test_rates_must_be_positive(rate):
    with pytest.raises(BenchConfigError):
        arrival_offsets_s(3, rate, seed=0)
