"""A request-rate sweep: the same dataset run at several rates, one after another, each run
complete before the next starts, then one summary point per rate."""
from __future__ import annotations

import dataclasses
import math

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.runner import BenchConfig, BenchResult, run_benchmark

POINT_FIELDS = (
    "completed", "failed", "duration", "request_throughput", "request_goodput", "output_throughput",
    "total_token_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms",
)


def parse_rates(text: str) -> list[float]:
    """"1,2,4,inf" -> [1.0, 2.0, 4.0, inf]."""
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or any(not rate > 0 for rate in rates):
        raise ValueError(f"request rates must be positive numbers or inf, got {text!r}")
    return rates


def rate_label(label: str, request_rate: float) -> str:
    return f"{label}_rate{'inf' if math.isinf(request_rate) else f'{request_rate:g}'}"


async def run_sweep(config: BenchConfig, requests: list[BenchRequest], rates: list[float],
                    progress: bool = True) -> list[BenchResult]:
    results = []
    for rate in rates:
        run_config = dataclasses.replace(config, request_rate=rate, label=rate_label(config.label, rate))
        results.append(await run_benchmark(run_config, requests, progress))
    return results


def sweep_json(label: str, results: list[BenchResult]) -> dict:
    points = []
    for result in results:
        figures = result.to_json_dict()
        points.append({"request_rate": figures["request_rate"], "label": figures["label"],
                       **{key: figures[key] for key in POINT_FIELDS}})
    return {"label": label, "points": points}
