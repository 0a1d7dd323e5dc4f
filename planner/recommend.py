"""Which xPyD split of a GPU budget serves a workload best: every split simulated on the same
requests at the fleet's total rate, the pick the highest SLO attainment; among splits within
`ATTAINMENT_TIE` of it, the lowest p90 TTFT plus p90 TPOT as shares of their SLOs, then fewer
prefill servers.
"""
from __future__ import annotations

from tqdm import tqdm

from pdserve.planner.profile import Profile
from pdserve.planner.simulate import Workload, XpYd, simulate

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
