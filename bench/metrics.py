"""Aggregate figures of a run from its request records, as `vllm bench serve` computes them.

Only successful requests count towards latencies, tokens and throughput. TPOT per request is
(E2EL - TTFT) / (output tokens - 1), 0 for one token; ITL pools every request's gaps. Goodput
counts the successful requests within every SLO (ms; "ttft", "tpot", "e2el") per second of the
run. Percentiles are numpy's (linear interpolation); an empty sample gives 0, as in vLLM.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from pdserve.bench.errors import BenchConfigError
from pdserve.bench.records import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2el")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)


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
    latencies_ms: dict[str, float]  # "{mean,median,std,p90,p99}_{ttft,tpot,itl,e2el}_ms" -> ms

    def to_dict(self) -> dict:
        names = [field.name for field in dataclasses.fields(self) if field.name != "latencies_ms"]
        return {**{name: getattr(self, name) for name in names}, **self.latencies_ms}


def validate_slos(goodput_slos_ms: dict[str, float]) -> None:
    for key, value_ms in goodput_slos_ms.items():
        if key not in SLO_KEYS:
            raise BenchConfigError(f"goodput SLO {key!r} is not one of {SLO_KEYS}")
        if not value_ms > 0:
            raise BenchConfigError(f"goodput SLO {key} must be positive milliseconds, got {value_ms}")


def parse_slos(items: list[str]) -> dict[str, float]:
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0}, validated."""
    slos_ms = {}
    for item in items:
        key, _, value = item.partition(":")
        try:
            slos_ms[key] = float(value)
        except ValueError as error:
            raise BenchConfigError(f"an SLO is KEY:MS, got {item!r}") from error
    validate_slos(slos_ms)
    return slos_ms


def tpot_s(record: RequestRecord) -> float:
    return (record.e2el_s - record.ttft_s) / (record.output_len - 1) if record.output_len > 1 else 0.0


def meets_slos(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    measured_s = {"ttft": record.ttft_s, "tpot": tpot_s(record), "e2el": record.e2el_s}
    return all(measured_s[key] * 1000.0 <= limit_ms for key, limit_ms in slos_ms.items())


def compute_metrics(records: list[RequestRecord], duration_s: float,
                    goodput_slos_ms: dict[str, float] | None = None) -> BenchMetrics:
    if duration_s <= 0:
        raise BenchConfigError(f"duration must be positive, got {duration_s}")
    validate_slos(goodput_slos_ms or {})
    done = [record for record in records if record.success]
    total_input = sum(record.prompt_len for record in done)
    total_output = sum(record.output_len for record in done)
    samples_s = {"ttft": [record.ttft_s for record in done], "tpot": [tpot_s(record) for record in done],
                 "itl": [gap_s for record in done for gap_s in record.itl_s],
                 "e2el": [record.e2el_s for record in done]}
    latencies_ms = {}
    for metric, samples in samples_s.items():
        values_ms = np.asarray(samples or [0.0]) * 1000.0
        latencies_ms |= {f"mean_{metric}_ms": float(np.mean(values_ms)), f"std_{metric}_ms": float(np.std(values_ms)),
                         f"median_{metric}_ms": float(np.median(values_ms)),
                         **{f"p{p}_{metric}_ms": float(np.percentile(values_ms, p)) for p in PERCENTILES}}
    return BenchMetrics(
        completed=len(done), failed=len(records) - len(done),
        total_input_tokens=total_input, total_output_tokens=total_output, duration=duration_s,
        request_throughput=len(done) / duration_s,
        request_goodput=sum(meets_slos(record, goodput_slos_ms) for record in done) / duration_s
        if goodput_slos_ms else None,
        output_throughput=total_output / duration_s, total_token_throughput=(total_input + total_output) / duration_s,
        max_output_tokens_per_s=_max_pieces_per_second(done), max_concurrent_requests=_max_concurrency(records),
        latencies_ms=latencies_ms)


def _max_pieces_per_second(done: list[RequestRecord]) -> float:
    """The most output pieces in any whole second of the run (one token per piece, as vLLM counts)."""
    arrival_s = [t for record in done for t in np.cumsum([record.start_s + record.ttft_s, *record.itl_s]).tolist()]
    return float(np.bincount(np.floor(arrival_s).astype(int)).max()) if arrival_s else 0.0


def _max_concurrency(records: list[RequestRecord]) -> int:
    """The most requests in flight at once (an end at the instant of a start does not overlap it)."""
    events = sorted([(r.start_s, 1) for r in records] + [(r.start_s + r.e2el_s, -1) for r in records])
    return max(np.cumsum([change for _, change in events]).tolist(), default=0)
