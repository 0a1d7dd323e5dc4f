"""The split recommendation: every split of a budget scored at the fleet's rate, one picked."""
from pdserve.planner.recommend import pick, sweep_splits
from pdserve.planner.report import fleet_markdown
from pdserve.planner.simulate import Workload

from tests.plan.profiles import make_profile

SLOS_MS = {"ttft": 200, "tpot": 20}


def test_every_split_of_the_budget_is_simulated_on_the_same_requests():
    candidates = sweep_splits(make_profile(), 3, Workload(5, 50, 16, 4), SLOS_MS, progress=False)
    assert [c["config"] for c in candidates] == ["1P2D", "2P1D"]
    assert all(c["completed"] == 50 and c["total_input_tokens"] == candidates[0]["total_input_tokens"]
               for c in candidates)
    fleet = {"fleets": [{"num_gpus": 3, "request_rate": 5, "recommended": pick(candidates, SLOS_MS),
                         "candidates": candidates}]}
    assert "| 3 | 5 |" in fleet_markdown(fleet)


def _candidate(num_prefill: int, attainment: float, p90_ttft_ms: float, p90_tpot_ms: float) -> dict:
    return {"config": f"{num_prefill}P{8 - num_prefill}D", "num_prefill": num_prefill, "slo_attainment": attainment,
            "p90_ttft_ms": p90_ttft_ms, "p90_tpot_ms": p90_tpot_ms}


def test_the_pick_is_the_best_attainment_then_the_lowest_tails_then_fewer_prefill_servers():
    best_attainment = _candidate(2, 1.000, 190, 19)
    close_with_lower_tails = _candidate(5, 0.996, 100, 10)  # within the tie of the best
    assert pick([best_attainment, close_with_lower_tails, _candidate(3, 0.9, 10, 1)], SLOS_MS) == close_with_lower_tails
    assert pick([best_attainment, _candidate(4, 0.99, 10, 1)], SLOS_MS) == best_attainment  # 0.01 is no tie
    assert pick([_candidate(5, 1.0, 100, 10), _candidate(3, 1.0, 100, 10)], SLOS_MS)["config"] == "3P5D"
