"""A run's figures from its requests' times: TTFT and TPOT percentiles, goodput, SLO attainment.

One definition for simulated and measured runs alike, the one `pdserve bench` uses
(bench/metrics.py): TTFT from send to the first token at the client, TPOT (E2EL - TTFT) over the
output tokens less one, goodput the requests within both SLOs per second of the run, from the
first send to the last token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdserve.planner.workload import Slo

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class RequestTimes:
    arrival_s: float
    first_token_s: float  # at the client
    finish_s: float  # the last token at the client
    output_len: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """0 for one token."""
        return 0.0 if self.output_len <= 1 else (self.finish_s - self.first_token_s) / (self.output_len - 1)


@dataclass(frozen=True, slots=True)
class SimSummary:
    ttft_ms: dict[int, float]  # percentile -> ms
    tpot_ms: dict[int, float]
    goodput_rps: float  # requests/s within both SLOs, over the run's duration
    slo_attainment: float  # fraction of requests within both SLOs
    throughput_rps: float
    duration_s: float

    @staticmethod
    def of(times: list[RequestTimes], slo: Slo) -> SimSummary:
        ttfts_ms = np.array([t.ttft_s for t in times]) * 1000
        tpots_ms = np.array([t.tpot_s for t in times]) * 1000
        good = int(np.sum((ttfts_ms <= slo.ttft_ms) & (tpots_ms <= slo.tpot_ms)))
        duration_s = max(t.finish_s for t in times) - min(t.arrival_s for t in times)
        duration_s = duration_s if duration_s > 0 else float("inf")
        return SimSummary(
            ttft_ms={p: float(np.percentile(ttfts_ms, p)) for p in PERCENTILES},
            tpot_ms={p: float(np.percentile(tpots_ms, p)) for p in PERCENTILES},
            goodput_rps=good / duration_s, slo_attainment=good / len(times),
            throughput_rps=len(times) / duration_s, duration_s=duration_s)

    def to_dict(self) -> dict:
        return {**{f"p{p}_ttft_ms": v for p, v in self.ttft_ms.items()},
                **{f"p{p}_tpot_ms": v for p, v in self.tpot_ms.items()},
                "goodput_rps": self.goodput_rps, "slo_attainment": self.slo_attainment,
                "throughput_rps": self.throughput_rps, "duration_s": self.duration_s}
