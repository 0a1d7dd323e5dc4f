"""The split recommendation on a CPU host whose front's work shares the replicas' cores."""
from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.profile import ServingOverhead
from pdserve.planner.recommend import pick, sweep_splits
from pdserve.planner.report import fleet_markdown
from pdserve.planner.workload import Slo, Workload

from tests.plan.profiles import make_profile

WORKLOAD = Workload(5, 50, 16, 4)


def _sharing(front_per_request_s: float) -> ServingOverhead:
    return ServingOverhead(cpu=CpuSharing(True, front=CpuDemand(per_request_s=front_per_request_s)))


def test_front_work_beyond_what_the_cores_hold_makes_every_split_miss_its_slo():
    # 5 requests/s at 0.8 CPU s each: 4 cores' worth of front work on a 3-replica host
    light = sweep_splits(make_profile(serving=_sharing(0.01)), 3, WORKLOAD, Slo(10_000, 1_000), progress=False)
    slo = Slo(ttft_ms=2 * max(c.summary.ttft_ms[90] for c in light), tpot_ms=2 * max(c.summary.tpot_ms[90] for c in light))
    assert all(c.summary.slo_attainment > 0.99 for c in light)
    heavy = sweep_splits(make_profile(serving=_sharing(0.8)), 3, WORKLOAD, slo, progress=False)
    assert [str(c.config) for c in heavy] == ["1P2D", "2P1D"]
    assert all(c.summary.slo_attainment < 0.5 for c in heavy)
    best = pick(heavy, slo)
    fleet = {"fleets": [{"num_gpus": 3, "request_rate": 5, "recommended": best.to_dict(),
                         "candidates": [c.to_dict() for c in heavy]}]}
    assert "| 3 | 5 |" in fleet_markdown(fleet)
