"""A small synthetic profile: round step times so that expected answers can be written by hand;
and runs of a system that behaves as a profile models it, as a validation would have measured them."""

from pdserve.bench.records import RequestRecord
from pdserve.planner.profile import DecodeFit, PrefillFit, Profile, ServingOverhead
from pdserve.planner.simulate import Simulation, XpYd
from pdserve.planner.workload import Workload


def make_profile(prefill=PrefillFit(0.010, 0.0001, 0.0), decode=DecodeFit(0.005, 0.001, 0.0),
                 serving=ServingOverhead(), max_num_batched_tokens=2048, transfer_gb_per_s=1.0,
                 kv_bytes_per_token=1000) -> Profile:
    return Profile(hardware={"device": "cpu", "name": "test"}, model={"dir": "test"},
                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=256,
                   kv_bytes_per_token=kv_bytes_per_token, transfer_gb_per_s=transfer_gb_per_s,
                   prefill=prefill, decode=decode, serving=serving)


def simulated_run(profile: Profile, config: XpYd, ttft_scale: float = 1.0) -> list[RequestRecord]:
    """The records of a run of 200 requests at 10/s on a system that behaves as `profile`
    models it, each TTFT (and so each E2EL) then stretched by `ttft_scale`."""
    requests = Workload(10, 200, 128, 16, range_ratio=0.5).requests()
    records = []
    for request, times in zip(requests, Simulation(profile, config).run(requests)):
        ttft_s = times.ttft_s * ttft_scale
        records.append(RequestRecord(prompt_len=request.prompt_len, output_len=request.output_len, ttft_s=ttft_s,
                                     itl_s=[], e2el_s=ttft_s + times.finish_s - times.first_token_s,
                                     success=True, error="", start_s=request.arrival_s))
    return records
