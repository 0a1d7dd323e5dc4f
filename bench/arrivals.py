"""When each request is sent: offsets from the start of the run, a pure function of the seed.

As in `vllm bench serve`: an infinite rate sends everything at once; otherwise the gaps between
consecutive requests are gamma-distributed with shape `burstiness` and scale
1 / (rate * burstiness), so their mean is 1 / rate whatever the burstiness (1 = Poisson;
below 1 burstier, above 1 more regular). The first request goes at offset 0.
"""
from __future__ import annotations

import math

import numpy as np

from pdserve.bench.errors import BenchConfigError


def arrival_offsets_s(num_requests: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    if request_rate <= 0 or math.isnan(request_rate):
        raise BenchConfigError(f"request_rate must be positive (or inf), got {request_rate}")
    if burstiness <= 0:
        raise BenchConfigError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(request_rate) or num_requests == 0:
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    gaps_s = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests - 1)
    return [0.0] + np.cumsum(gaps_s).tolist()
