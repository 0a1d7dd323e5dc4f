"""Which xPyD split of a GPU budget serves a workload best: every split simulated, one picked.

At the workload's rate every split of the budget serves the same requests, so the pick is the
split with the highest SLO attainment (the fraction of requests within both SLOs: goodput over
throughput); among splits within `ATTAINMENT_TIE` of it, the one with the lowest sum of p90 TTFT
and p90 TPOT as shares of their SLOs, then fewer prefill servers. The rate is the fleet's total;
fronts scale with the fleet (`gpus_per_gateway`), since one gateway's per-request cost would
otherwise cap any fleet.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tqdm import tqdm

from pdserve.planner.profile import Profile
from pdserve.planner.simulate import XpYd, simulate
from pdserve.planner.summary import SimSummary
from pdserve.planner.workload import Slo, Workload

ATTAINMENT_TIE = 0.005  # absolute


@dataclass(frozen=True, slots=True)
class Candidate:
    config: XpYd
    summary: SimSummary

    @property
    def goodput_per_gpu_rps(self) -> float:
        return self.summary.goodput_rps / self.config.num_gpus

    def to_dict(self) -> dict:
        return {"config": str(self.config), "num_prefill": self.config.num_prefill,
                "num_decode": self.config.num_decode, **self.summary.to_dict(),
                "goodput_per_gpu_rps": self.goodput_per_gpu_rps}


def sweep_splits(profile: Profile, num_gpus: int, workload: Workload, slo: Slo,
                 gpus_per_gateway: int = 2, progress: bool = True) -> list[Candidate]:
    requests = workload.requests()
    num_gateways = max(1, math.ceil(num_gpus / gpus_per_gateway))
    configs = [XpYd(p, num_gpus - p) for p in range(1, num_gpus)]
    return [Candidate(config, simulate(profile, config, requests, slo, num_gateways))
            for config in tqdm(configs, desc=f"{num_gpus} GPUs", unit="split", disable=not progress)]


def pick(candidates: list[Candidate], slo: Slo) -> Candidate:
    best = max(c.summary.slo_attainment for c in candidates)
    close = [c for c in candidates if c.summary.slo_attainment >= best - ATTAINMENT_TIE]
    return min(close, key=lambda c: (c.summary.ttft_ms[90] / slo.ttft_ms + c.summary.tpot_ms[90] / slo.tpot_ms,
                                     c.config.num_prefill))
