"""The workload a plan is for: arrivals and prompt and output lengths.

They come from the benchmark's own generators (`bench.datasets`, `bench.arrivals`) with the same
seed, so a simulated trace is the trace `pdserve bench` sends with the same flags, request for
request. The SLOs that define goodput are `bench.metrics`' ({"ttft": ms, "tpot": ms}).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from pdserve.bench.arrivals import arrival_offsets_s
from pdserve.bench.datasets import make_dataset


@dataclass(frozen=True, slots=True)
class SimRequest:
    arrival_s: float
    prompt_len: int
    output_len: int


@dataclass(frozen=True, slots=True)
class Workload:
    request_rate: float  # requests/s; inf sends every request at once
    num_requests: int
    input_len: int
    output_len: int
    range_ratio: float = 0.0
    dataset: str = "random"  # one of bench.datasets.DATASET_KINDS
    burstiness: float = 1.0  # gamma shape of the arrival gaps; 1 = Poisson
    seed: int = 0

    def requests(self) -> list[SimRequest]:
        dataset = make_dataset(self.dataset, num_prompts=self.num_requests, seed=self.seed,
                               input_len=self.input_len, output_len=self.output_len,
                               range_ratio=self.range_ratio, vocab_size=2)
        offsets_s = arrival_offsets_s(self.num_requests, self.request_rate, self.burstiness, self.seed)
        return [SimRequest(offset_s, len(request.prompt_token_ids), request.output_len)
                for offset_s, request in zip(offsets_s, dataset)]

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "request_rate": "inf" if math.isinf(self.request_rate)
                else self.request_rate}
