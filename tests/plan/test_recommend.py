"""The split recommendation where a split's CPUs cannot hold its work: it serves nothing, and
the sweep goes on."""
from planner.cpu_sharing import CpuDemand, CpuSharing
from planner.profile import ServingOverhead
from planner.recommend import pick, sweep_splits
from planner.report import fleet_markdown
from planner.workload import Slo, Workload

from tests.plan.profiles import make_profile

SLO = Slo(ttft_ms=10_000, tpot_ms=1_000)


def test_splits_whose_cores_are_oversubscribed_serve_nothing():
    # a front that takes 3.5 CPU s/s with no requests at all: more than 3 replicas' cores hold
    oversubscribed = make_profile(serving=ServingOverhead(cpu=CpuSharing(True, front=CpuDemand(idle_s_per_s=3.5))))
    candidates = sweep_splits(oversubscribed, 3, Workload(5, 50, 16, 4), SLO, progress=False)
    assert [str(c.config) for c in candidates] == ["1P2D", "2P1D"]
    for candidate in candidates:
        assert candidate.summary.goodput_rps == 0.0 and candidate.summary.slo_attainment == 0.0
        assert candidate.summary.ttft_ms[90] == float("inf")
    best = pick(candidates, SLO)
    fleet = {"fleets": [{"num_gpus": 3, "request_rate": 5, "recommended": best.to_dict(),
                         "candidates": [c.to_dict() for c in candidates]}]}
    assert "| 3 | 5 |" in fleet_markdown(fleet)


def test_a_front_the_cores_can_hold_leaves_every_split_served():
    served = make_profile(serving=ServingOverhead(cpu=CpuSharing(True, front=CpuDemand(idle_s_per_s=1.0))))
    candidates = sweep_splits(served, 3, Workload(5, 50, 16, 4), SLO, progress=False)
    assert all(c.summary.slo_attainment == 1.0 for c in candidates)
