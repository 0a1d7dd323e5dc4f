"""Step-to-step jitter: measured spreads kept as samples, drawn from with a seeded generator.

A spread is a list of samples of one quantity's variation, measured, never assumed: ratios to a
median (engine steps) or residuals in seconds from a fit or a model (a request's decode span,
its TTFT under a light load). `Draws` picks one sample per event, uniformly, from a generator
(`random.Random`, fast for one draw at a time) seeded once per simulation run. Invariants: an
empty spread draws the neutral value (ratio 1, residual 0) and consumes nothing, so a profile
without spreads simulates as the median model; a spread of only neutral values gives the same
answers; the same seed and event order give the same draws.
"""
from __future__ import annotations

import random
import statistics


def ratios_to_median(timings_s: list[float]) -> list[float]:
    """Each timing over the median of them all: the spread of one measured point, median 1."""
    median_s = statistics.median(timings_s)
    return [t / median_s for t in timings_s]


class Draws:
    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def ratio(self, ratios: list[float]) -> float:
        return self._rng.choice(ratios) if ratios else 1.0

    def residual_s(self, residuals_s: list[float]) -> float:
        return self._rng.choice(residuals_s) if residuals_s else 0.0
