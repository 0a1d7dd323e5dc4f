"""Which xPyD split of a GPU budget serves a workload best: every split simulated, one picked.

At the workload's rate every split of the budget serves the same requests, so the pick is the
split with the highest SLO attainment (the share of requests within both SLOs); among splits
within `ATTAINMENT_TIE` of it, the one with the lowest sum of p90 TTFT and p90 TPOT as shares of
their SLOs, then fewer prefill servers. The rate is the fleet's total.
"""
from __future__ import annotations

from tqdm import tqdm

from pdserve.planner.profile import Profile
from pdserve.planner.simulate import XpYd, simulate
from pdserve.planner.workload import Workload

ATTAINMENT_TIE = 0.005  # absolute


def sweep_splits(profile: Profile, num_gpus: int, workload: Workload, slos_ms: dict[str, float],
                 progress: bool = True) -> list[dict]:
    """Every split's figures (`simulate`'s), with its "config", "num_prefill" and "num_decode"."""
    requests = workload.requests()
    configs = [XpYd(p, num_gpus - p) for p in range(1, num_gpus)]
    return [{"config": str(config), "num_prefill": config.num_prefill, "num_decode": config.num_decode,
             **simulate(profile, config, requests, slos_ms)}
            for config in tqdm(configs, desc=f"{num_gpus} GPUs", unit="split", disable=not progress)]


def pick(candidates: list[dict], slos_ms: dict[str, float]) -> dict:
    best = max(c["slo_attainment"] for c in candidates)
    close = [c for c in candidates if c["slo_attainment"] >= best - ATTAINMENT_TIE]
    return min(close, key=lambda c: (c["p90_ttft_ms"] / slos_ms["ttft"] + c["p90_tpot_ms"] / slos_ms["tpot"],
                                     c["num_prefill"]))
