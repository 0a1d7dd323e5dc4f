"""Arrival schedules: the rate is kept on average, the seed fixes the schedule, inf sends at once."""
import math

import numpy as np
import pytest

from pdserve.bench.arrivals import arrival_offsets_s
from pdserve.bench.errors import BenchConfigError


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_mean_gap_is_one_over_the_rate_whatever_the_burstiness(burstiness):
    offsets_s = arrival_offsets_s(20_001, request_rate=8.0, burstiness=burstiness, seed=3)
    gaps_s = np.diff(offsets_s)
    assert offsets_s[0] == 0.0
    assert np.all(gaps_s >= 0)
    assert gaps_s.mean() == pytest.approx(1 / 8.0, rel=0.03)


def test_burstiness_sets_the_spread_of_gaps():
    # Gamma gaps with shape k have coefficient of variation 1/sqrt(k): 1 for Poisson.
    for burstiness in (0.25, 1.0, 4.0):
        gaps_s = np.diff(arrival_offsets_s(20_001, 2.0, burstiness, seed=0))
        assert gaps_s.std() / gaps_s.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_same_seed_same_schedule_other_seed_other_schedule():
    assert arrival_offsets_s(50, 4.0, 1.0, seed=7) == arrival_offsets_s(50, 4.0, 1.0, seed=7)
    assert arrival_offsets_s(50, 4.0, 1.0, seed=7) != arrival_offsets_s(50, 4.0, 1.0, seed=8)


def test_infinite_rate_sends_everything_at_once():
    assert arrival_offsets_s(5, math.inf, 1.0, seed=0) == [0.0] * 5


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (1.0, 0.0)])
def test_rates_and_burstiness_must_be_positive(rate, burstiness):
    with pytest.raises(BenchConfigError):
        arrival_offsets_s(3, rate, burstiness, seed=0)
