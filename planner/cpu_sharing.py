"""CPU work beside the engines' steps: what each part of a CPU host spends, per thing it serves.

On a CPU host `pdserve up` pins each replica to a core of its own. Beside its engine thread a
replica runs its own request handling on that core (gRPC and asyncio: admission, the KV handoff,
streamed tokens), and the front (the gateway, Redis, `up`'s supervisor and the benchmark client,
which runs on the same machine in every measured run) floats over all those cores. Each is a
CPU demand, linear in what it serves:

    cpu_s = idle * seconds + per_request * requests + per_output_token * tokens
            + per_decode_step * decode steps

The per-step term is what a decode step costs whatever its batch: its tokens reach the gateway,
and the client, together (a wake-up, a message), so a token streamed beside others costs less
than one streamed alone. The simulation runs each term as CPU work at the event it belongs to
(planner/simulate.py), sharing the host's cores with the engines' steps (planner/shared_cpus.py).
Where the replicas do not share their cores with this work (a GPU profile: no serving runs,
every figure 0) none of it is simulated.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CpuDemand:
    idle_s_per_s: float = 0.0  # heartbeats, registry refreshes: with no requests
    per_request_s: float = 0.0
    per_output_token_s: float = 0.0
    per_decode_step_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CpuSharing:
    shares_replica_cpus: bool = False
    front: CpuDemand = field(default_factory=CpuDemand)
    prefill: CpuDemand = field(default_factory=CpuDemand)  # a prefill replica, beside its engine
    decode: CpuDemand = field(default_factory=CpuDemand)  # a decode replica, beside its engine
