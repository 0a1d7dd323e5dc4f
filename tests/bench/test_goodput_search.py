"""Goodput search: attainment counts failed requests as missing; the goodput is the highest rate
met with every lower rate met; the climb stops at the first miss and bisects below it."""
import pytest

from pdserve.bench.goodput_search import Point, attainment, goodput, search
from pdserve.bench.records import RequestRecord

SLOS_MS = {"ttft": 1000.0, "tpot": 100.0}


def record(ttft_s: float, e2el_s: float, success: bool = True) -> RequestRecord:
    return RequestRecord(prompt_len=10, output_len=11, ttft_s=ttft_s, itl_s=[], e2el_s=e2el_s, success=success,
                         error="" if success else "cut")


def test_attainment_needs_both_slos_and_counts_failures_as_misses():
    records = [record(0.5, 1.5),  # TPOT 100 ms: met
               record(1.2, 1.3),  # TTFT over
               record(0.1, 1.2),  # TPOT 110 ms: over
               record(0.1, 0.2, success=False)]
    assert attainment(records, SLOS_MS) == 0.25
    with pytest.raises(ValueError):
        attainment([], SLOS_MS)


def points(*pairs):
    return [Point(rate, met, {}) for rate, met in pairs]


def test_goodput_is_the_highest_rate_met_below_every_miss():
    assert goodput(points((0.5, 0.95), (1.0, 0.92), (2.0, 0.5)), 0.9) == 1.0
    assert goodput(points((2.0, 0.95), (0.5, 0.95), (1.0, 0.6)), 0.9) == 0.5  # a lucky run above a miss
    assert goodput(points((0.5, 0.8), (1.0, 0.95)), 0.9) is None


def test_search_climbs_until_the_first_miss_then_bisects_below_it():
    capacity = 0.8  # the rate this fake system meets the target up to

    def measure(rate):
        ran.append(rate)
        return Point(rate, 1.0 if rate <= capacity else 0.2, {})

    ran = []
    found = search(measure, [1.0, 0.25, 0.5, 2.0], 0.9, bisect_steps=2)
    assert ran == [0.25, 0.5, 1.0, 0.75, 0.875]
    assert goodput(found, 0.9) == 0.75

    ran = []
    search(measure, [0.25, 0.5], 0.9, bisect_steps=3)
    assert ran == [0.25, 0.5]  # nothing missed: nothing to bisect

    ran = []
    search(measure, [1.0, 2.0], 0.9, bisect_steps=3)
    assert ran == [1.0]  # the lowest rate missed: nothing met to bisect from
