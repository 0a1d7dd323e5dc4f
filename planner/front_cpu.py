"""The front's CPU on the replicas' cores: processor sharing slows every engine step.

The front is every process of a measured system but the replicas: the gateway, Redis, `pdserve
up`'s supervisor, and the benchmark client (it runs on the same machine in every measured run,
profile and validation alike). On a CPU host where `pdserve up` pins each replica to its own
core and the front floats over those same cores, the front's work takes a share of each core:

    front_cpu_s_per_s = idle_cpu_s_per_s + rate * (cpu_s_per_request + cpu_s_per_output_token * mean output)
    utilization       = front_cpu_s_per_s / num_replica_cpus        (spread evenly over them)
    engine step_s    *= 1 / (1 - utilization)                         (processor sharing)

with `rate` the trace's mean arrival rate (gaps / span; a trace without one, a burst or a lone
request, adds no per-request term). The coefficients are measured in the profile's serving runs
(planner/serving.py) from the processes' CPU seconds (planner/proc_cpu.py). Where the front does
not share the replicas' cores (a GPU profile: no serving runs, every figure 0) the factor is 1.
Neglected: the serving overheads were themselves measured with the front's light load of the
profile's single requests (a few % of a core), and the front's bursts are taken as a fluid share.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.workload import SimRequest


@dataclass(frozen=True, slots=True)
class FrontCpu:
    shares_replica_cpus: bool = False
    idle_cpu_s_per_s: float = 0.0  # heartbeats, registry refreshes: CPU seconds per second with no requests
    cpu_s_per_request: float = 0.0
    cpu_s_per_output_token: float = 0.0  # streamed tokens: gRPC to the gateway, SSE to the client

    def cpu_s_per_s(self, requests: list[SimRequest]) -> float:
        """CPU seconds per second the front takes over the trace, at its mean arrival rate."""
        arrivals_s = [r.arrival_s for r in requests]
        span_s = max(arrivals_s, default=0.0) - min(arrivals_s, default=0.0)
        if span_s <= 0:
            return self.idle_cpu_s_per_s
        rate = (len(requests) - 1) / span_s
        per_request_s = sum(self.cpu_s_per_request + self.cpu_s_per_output_token * r.output_len
                            for r in requests) / len(requests)
        return self.idle_cpu_s_per_s + rate * per_request_s

    def step_stretch(self, requests: list[SimRequest], num_replica_cpus: int) -> float:
        """The factor every engine step is slowed by: 1 unless the front shares the replicas' cores."""
        if not self.shares_replica_cpus:
            return 1.0
        utilization = self.cpu_s_per_s(requests) / num_replica_cpus
        if utilization >= 1:
            raise ValueError(f"the front would take {utilization:.0%} of the replicas' {num_replica_cpus} CPUs")
        return 1 / (1 - utilization)
