"""DistServe's goodput: the highest request rate at which enough requests meet every SLO.

A point is one run at one rate; its attainment is the share of all its requests (failed ones
missing) that met every SLO. The search climbs the rates in order to the first that misses the
target, then bisects `bisect_steps` times between the highest rate met and that miss.
Invariant: the goodput is the highest measured rate that met the target with every lower
measured rate meeting it too, so one lucky run above a miss never raises it; None when even the
lowest rate missed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.bench.metrics import meets_slos
from pdserve.bench.records import RequestRecord


@dataclass(frozen=True, slots=True)
class Point:
    request_rate: float  # requests/s
    attainment: float
    figures: dict  # the run's summary: latencies, throughput, counts


def attainment(records: list[RequestRecord], slos_ms: dict[str, float]) -> float:
    if not records:
        raise ValueError("attainment of an empty run")
    return sum(record.success and meets_slos(record, slos_ms) for record in records) / len(records)


def goodput(points: list[Point], target: float) -> float | None:
    best = None
    for point in sorted(points, key=lambda point: point.request_rate):
        if point.attainment < target:
            break
        best = point.request_rate
    return best


def search(measure: Callable[[float], Point], rates: list[float], target: float, bisect_steps: int) -> list[Point]:
    """Runs `measure(rate)` at the rates the search picks; the points in the order they ran."""
    points: list[Point] = []
    for rate in sorted(rates):
        points.append(measure(rate))
        if points[-1].attainment < target:
            break
    for _ in range(bisect_steps):
        low = goodput(points, target)
        misses = [point.request_rate for point in points
                  if point.attainment < target and (low is None or point.request_rate > low)]
        if low is None or not misses:
            break
        points.append(measure(round((low + min(misses)) / 2, 3)))
    return points
