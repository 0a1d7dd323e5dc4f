"""The split recommendation: every split of a budget scored at the fleet's rate, one picked."""
from pdserve.planner.profile import ServingOverhead
from pdserve.planner.recommend import Candidate, pick, sweep_splits
from pdserve.planner.report import fleet_markdown
from pdserve.planner.simulate import XpYd
from pdserve.planner.summary import SimSummary
from pdserve.planner.workload import Slo, Workload

from tests.plan.profiles import make_profile

WORKLOAD = Workload(5, 50, 16, 4)


def test_a_fleet_whose_front_cannot_hold_the_rate_has_every_split_miss_its_slo():
    # 5 requests/s at 0.4 s of gateway work each, through one gateway: twice what it can serve
    light = sweep_splits(make_profile(serving=ServingOverhead(gateway_s=0.01)), 3, WORKLOAD, Slo(10_000, 1_000),
                         gpus_per_gateway=3, progress=False)
    slo = Slo(ttft_ms=2 * max(c.summary.ttft_ms[90] for c in light),
              tpot_ms=2 * max(c.summary.tpot_ms[90] for c in light))
    assert all(c.summary.slo_attainment > 0.99 for c in light)
    heavy = sweep_splits(make_profile(serving=ServingOverhead(gateway_s=0.4)), 3, WORKLOAD, slo,
                         gpus_per_gateway=3, progress=False)
    assert [str(c.config) for c in heavy] == ["1P2D", "2P1D"]
    assert all(c.summary.slo_attainment < 0.5 for c in heavy)
    best = pick(heavy, slo)
    fleet = {"fleets": [{"num_gpus": 3, "request_rate": 5, "recommended": best.to_dict(),
                         "candidates": [c.to_dict() for c in heavy]}]}
    assert "| 3 | 5 |" in fleet_markdown(fleet)


def _candidate(num_prefill: int, attainment: float, p90_ttft_ms: float, p90_tpot_ms: float) -> Candidate:
    summary = SimSummary(ttft_ms={50: 0.0, 90: p90_ttft_ms, 99: 0.0}, tpot_ms={50: 0.0, 90: p90_tpot_ms, 99: 0.0},
                         goodput_rps=attainment, slo_attainment=attainment, throughput_rps=1.0, duration_s=1.0)
    return Candidate(XpYd(num_prefill, 8 - num_prefill), summary)


def test_the_pick_is_the_best_attainment_then_the_lowest_tails_then_fewer_prefill_servers():
    slo = Slo(ttft_ms=200, tpot_ms=20)
    best_attainment = _candidate(2, 1.000, 190, 19)
    close_with_lower_tails = _candidate(5, 0.996, 100, 10)  # within the tie of the best
    assert pick([best_attainment, close_with_lower_tails, _candidate(3, 0.9, 10, 1)], slo) == close_with_lower_tails
    assert pick([best_attainment, _candidate(4, 0.99, 10, 1)], slo) == best_attainment  # 0.01 is no tie
    assert pick([_candidate(5, 1.0, 100, 10), _candidate(3, 1.0, 100, 10)], slo).config == XpYd(3, 5)
