"""Aggregate figures of a run from its request records, as `vllm bench serve` computes them.

Only successful requests count towards latencies, token totals and throughput; failed ones
count in `failed`. TPOT per request is (E2EL - TTFT) / (output tokens - 1), 0 for one-token
outputs. ITL pools every request's gaps. Goodput counts the successful requests within every
given SLO (milliseconds, keys "ttft", "tpot", "e2el"), per second of the run. Percentiles are
numpy's (linear interpolation); an empty sample gives 0, as vLLM reports it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdserve.bench.errors import BenchConfigError
from pdserve.bench.records import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2el")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)


@dataclass(frozen=True, slots=True)
class LatencySummary:
    mean_ms: float
    median_ms: float
    std_ms: float
    percentiles_ms: dict[int, float]  # percentile -> milliseconds

    @staticmethod
    def of(samples_s: list[float]) -> LatencySummary:
        values_ms = np.asarray(samples_s or [0.0]) * 1000.0
        return LatencySummary(
            mean_ms=float(np.mean(values_ms)), median_ms=float(np.median(values_ms)),
            std_ms=float(np.std(values_ms)),
            percentiles_ms={p: float(np.percentile(values_ms, p)) for p in PERCENTILES})


@dataclass(frozen=True, slots=True)
class BenchMetrics:
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    duration: float  # seconds, as vLLM names it
    request_throughput: float
    request_goodput: float | None  # None when no SLO was given
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    latencies: dict[str, LatencySummary]  # "ttft" | "tpot" | "itl" | "e2el"

    def to_dict(self) -> dict:
        flat = {name: getattr(self, name) for name in (
            "completed", "failed", "total_input_tokens", "total_output_tokens", "duration",
            "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
            "max_output_tokens_per_s", "max_concurrent_requests")}
        for metric, summary in self.latencies.items():
            flat[f"mean_{metric}_ms"] = summary.mean_ms
            flat[f"median_{metric}_ms"] = summary.median_ms
            flat[f"std_{metric}_ms"] = summary.std_ms
            for percentile, value_ms in summary.percentiles_ms.items():
                flat[f"p{percentile}_{metric}_ms"] = value_ms
        return flat


def validate_slos(goodput_slos_ms: dict[str, float]) -> None:
    for key, value_ms in goodput_slos_ms.items():
        if key not in SLO_KEYS:
            raise BenchConfigError(f"goodput SLO {key!r} is not one of {SLO_KEYS}")
        if not value_ms > 0:
            raise BenchConfigError(f"goodput SLO {key} must be positive milliseconds, got {value_ms}")


def parse_slos(items: list[str]) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0}, validated, as `--goodput` takes them."""
    slos_ms = {}
    for item in items:
        key, _, value = item.partition(":")
        try:
            slos_ms[key] = float(value)
        except ValueError as error:
            raise BenchConfigError(f"--goodput takes KEY:MS pairs, got {item!r}") from error
    validate_slos(slos_ms)
    return slos_ms


def tpot_s(record: RequestRecord) -> float:
    if record.output_len <= 1:
        return 0.0
    return (record.e2el_s - record.ttft_s) / (record.output_len - 1)


def compute_metrics(records: list[RequestRecord], duration_s: float,
                    goodput_slos_ms: dict[str, float] | None = None) -> BenchMetrics:
    if duration_s <= 0:
        raise BenchConfigError(f"duration must be positive, got {duration_s}")
    validate_slos(goodput_slos_ms or {})
    done = [record for record in records if record.success]
    total_input = sum(record.prompt_len for record in done)
    total_output = sum(record.output_len for record in done)
    goodput = None
    if goodput_slos_ms:
        num_good = sum(meets_slos(record, goodput_slos_ms) for record in done)
        goodput = num_good / duration_s
    latencies = {
        "ttft": LatencySummary.of([record.ttft_s for record in done]),
        "tpot": LatencySummary.of([tpot_s(record) for record in done]),
        "itl": LatencySummary.of([gap_s for record in done for gap_s in record.itl_s]),
        "e2el": LatencySummary.of([record.e2el_s for record in done]),
    }
    return BenchMetrics(
        completed=len(done), failed=len(records) - len(done),
        total_input_tokens=total_input, total_output_tokens=total_output, duration=duration_s,
        request_throughput=len(done) / duration_s, request_goodput=goodput,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        max_output_tokens_per_s=_max_pieces_per_second(done),
        max_concurrent_requests=_max_concurrency(records), latencies=latencies)


def meets_slos(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    measured_s = {"ttft": record.ttft_s, "tpot": tpot_s(record), "e2el": record.e2el_s}
    return all(measured_s[key] * 1000.0 <= limit_ms for key, limit_ms in slos_ms.items())


def _max_pieces_per_second(done: list[RequestRecord]) -> float:
    """The most output pieces in any whole second of the run (one token per piece, as vLLM counts)."""
    arrival_s = [t for record in done for t in
                 np.cumsum([record.start_s + record.ttft_s, *record.itl_s]).tolist()]
    if not arrival_s:
        return 0.0
    counts = np.bincount(np.floor(np.asarray(arrival_s)).astype(int))
    return float(counts.max())


def _max_concurrency(records: list[RequestRecord]) -> int:
    """The most requests in flight at once (an end at the instant of a start does not overlap it)."""
    events = sorted([(r.start_s, 1) for r in records] + [(r.start_s + r.e2el_s, -1) for r in records],
                    key=lambda event: (event[0], event[1]))
    in_flight = most = 0
    for _, change in events:
        in_flight += change
        most = max(most, in_flight)
    return most
