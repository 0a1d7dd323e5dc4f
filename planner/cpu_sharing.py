"""CPU work beside the engines' steps, and how it slows them where it shares their cores.

On a CPU host `pdserve up` pins each replica to a core of its own. Beside its engine thread a
replica runs its own request handling on that core (gRPC and asyncio: admission, the KV handoff,
streamed tokens), and the front (the gateway, Redis, `up`'s supervisor and the benchmark client,
which runs on the same machine in every measured run) floats over all those cores. Each is a
CPU demand, linear in what it serves per second:

    cpu_s_per_s = idle + per_request * requests/s + per_output_token * tokens/s
                       + per_decode_step * decode steps/s

The per-step term is what a decode step costs whatever its batch: its tokens reach the gateway,
and the client, together (a wake-up, a message), so a token streamed beside others costs less
than one streamed alone. Each core i runs its replica's engine, whose steps take `work_i` CPU
seconds per second unslowed, its replica's own demand `own_i`, and a share of the front. Linux
wakes a floating thread on an idle core where it finds one, so the front's share of each core is
in proportion to the time the core has left:

    left_i  = max(0, 1 - work_i - own_i)
    front_i = front * left_i / sum(left)
    step_s *= 1 / (1 - own_i - front_i)        (processor sharing with the engine)

The engines' work comes from the simulation itself, which runs to a fixed point
(planner/simulate.py). Where the replicas do not share their cores with this work (a GPU
profile: no serving runs, every figure 0) every factor is 1. Neglected: that work's bursts
(taken as a fluid share) and how it lengthens the request handling timed on an idle system.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class CpuOversubscribedError(ValueError):
    """The engines and the work beside them would need more CPU than the replicas' cores have."""


@dataclass(frozen=True, slots=True)
class Activity:
    """What a server, or the whole system, served per second of a run."""

    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0  # every output token of the requests served, the first included
    decode_steps_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CpuDemand:
    idle_s_per_s: float = 0.0  # heartbeats, registry refreshes: with no requests
    per_request_s: float = 0.0
    per_output_token_s: float = 0.0
    per_decode_step_s: float = 0.0

    def cpu_s_per_s(self, activity: Activity) -> float:
        return (self.idle_s_per_s + self.per_request_s * activity.requests_per_s
                + self.per_output_token_s * activity.output_tokens_per_s
                + self.per_decode_step_s * activity.decode_steps_per_s)


@dataclass(frozen=True, slots=True)
class CoreUsage:
    """One replica's core over a simulated run."""

    kind: str  # "prefill" or "decode"
    engine_work_s_per_s: float  # its engine steps' CPU seconds per second, unslowed
    activity: Activity


@dataclass(frozen=True, slots=True)
class CpuSharing:
    shares_replica_cpus: bool = False
    front: CpuDemand = field(default_factory=CpuDemand)
    prefill: CpuDemand = field(default_factory=CpuDemand)  # a prefill replica, beside its engine
    decode: CpuDemand = field(default_factory=CpuDemand)  # a decode replica, beside its engine

    def front_cpu_s_per_s(self, cores: list[CoreUsage]) -> float:
        """The front's demand at what the system served: the prefills' requests, the decodes'
        tokens and steps."""
        prefills = [core.activity for core in cores if core.kind == "prefill"]
        decodes = [core.activity for core in cores if core.kind == "decode"]
        return self.front.cpu_s_per_s(Activity(
            requests_per_s=sum(a.requests_per_s for a in prefills),
            output_tokens_per_s=sum(a.output_tokens_per_s for a in decodes),
            decode_steps_per_s=sum(a.decode_steps_per_s for a in decodes)))

    def step_stretches(self, cores: list[CoreUsage]) -> list[float]:
        """The factor each core's engine steps are slowed by, in the order of `cores`."""
        if not self.shares_replica_cpus:
            return [1.0] * len(cores)
        return shared_core_stretches([core.engine_work_s_per_s for core in cores],
                                     [self._replica(core.kind).cpu_s_per_s(core.activity) for core in cores],
                                     self.front_cpu_s_per_s(cores))

    def _replica(self, kind: str) -> CpuDemand:
        return self.prefill if kind == "prefill" else self.decode


def shared_core_stretches(engine_work_s_per_s: list[float], own_s_per_s: list[float], front_s_per_s: float) -> list[float]:
    """Each core's factor from its engine's work, its replica's own demand and the front's, all
    in CPU seconds per second (the module's formula)."""
    if max(own_s_per_s) >= 1:
        raise CpuOversubscribedError(f"a replica's own work would take all of its core ({max(own_s_per_s):.2f} CPU s/s)")
    left = [max(0.0, 1 - work_s - own_s) for work_s, own_s in zip(engine_work_s_per_s, own_s_per_s)]
    if front_s_per_s > 0 and front_s_per_s >= sum(left):
        raise CpuOversubscribedError(f"the front ({front_s_per_s:.2f} CPU s/s) would take every CPU the {len(left)} replicas "
                         f"leave ({sum(left):.2f})")
    front_shares = [front_s_per_s * left_s / sum(left) if front_s_per_s > 0 else 0.0 for left_s in left]
    return [1 / (1 - own_s - share) for own_s, share in zip(own_s_per_s, front_shares)]
