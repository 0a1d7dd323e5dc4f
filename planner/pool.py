"""Profiles of one model on one machine, made apart in time, pooled into one.

A profile is a few minutes of a shared machine, and what those minutes catch (a neighbour's
burst during the serving runs, a cache-unfriendly placement) moves its fitted figures from one
profile to the next by more than the simulation's own error. A pool takes the middle of several:

1. each profile is set to the pool's reference speed, the median of their reference times
   (planner/speed.py `at_speed`), so that one made while the machine was slow counts at the
   same speed as the others (profiles without a reference time, GPU ones, are pooled as they are);
2. each fitted figure (a coefficient of a step fit, a serving overhead, a term of a CPU demand,
   the transfer rate) is the median of the profiles' figures, one figure at a time, so that no
   one profile's outlier sets it;
3. each measured spread (engine step repeats, TTFT delays, handoff residuals) and the serving
   runs' requests (the served speed reads its anchor from them) are the union of the profiles'.

Invariants: only profiles of the same model on the same kind of machine with the same engine
limits pool (`ALIKE_HARDWARE`, the model's shape, the batch limits, the KV layout); a pool of one
profile has that profile's figures; the pooled profile names its sources and their reference
times (`hardware["pooled_from"]`). The readings that one profile's served fits were refitted from
(`serving.cpu_samples`, `serving.engine_alone`) belong to that profile and stay in its file.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import TypeVar

from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.profile import DecodeFit, PrefillFit, Profile, ServingOverhead
from pdserve.planner.speed import at_speed

ALIKE_HARDWARE = ("device", "name", "threads", "num_cpus")
OVERHEADS = ("gateway_s", "ttft_s", "handoff_s", "step_s", "per_seq_step_s")
Figures = TypeVar("Figures", PrefillFit, DecodeFit, CpuDemand)


def pool(profiles: list[Profile], sources: list[str]) -> Profile:
    """One profile from `profiles` (read from `sources`, the names the pool records)."""
    if not profiles or len(profiles) != len(sources):
        raise ValueError(f"{len(profiles)} profiles from {len(sources)} sources")
    _check_alike(profiles, sources)
    references_s = [p.hardware.get("reference_s") for p in profiles]
    if any(references_s) and not all(references_s):
        raise ValueError("some profiles have a reference time and some do not: "
                         + ", ".join(f"{s}: {r}" for s, r in zip(sources, references_s)))
    reference_s = statistics.median(references_s) if all(references_s) else None
    profiles = [at_speed(p, reference_s) for p in profiles] if reference_s else profiles
    first, servings = profiles[0], [p.serving for p in profiles]
    hardware = {key: value for key, value in first.hardware.items() if key in ALIKE_HARDWARE or key == "torch"}
    if reference_s:
        hardware["reference_s"] = reference_s
    hardware["pooled_from"] = [{"source": s, "reference_s": r} for s, r in zip(sources, references_s)]
    return dataclasses.replace(
        first, hardware=hardware, transfer_gb_per_s=statistics.median(p.transfer_gb_per_s for p in profiles),
        prefill=_medians([p.prefill for p in profiles]), decode=_medians([p.decode for p in profiles]),
        serving=ServingOverhead(
            **{name: statistics.median(getattr(s, name) for s in servings) for name in OVERHEADS},
            ttft_delays_s=[d for s in servings for d in s.ttft_delays_s],
            handoff_residuals_s=[r for s in servings for r in s.handoff_residuals_s],
            cpu=CpuSharing(first.serving.cpu.shares_replica_cpus,
                           *(_medians([getattr(s.cpu, part) for s in servings]) for part in ("front", "prefill", "decode"))),
            samples=[sample for s in servings for sample in s.samples]),
        prefill_samples=[s for p in profiles for s in p.prefill_samples],
        decode_samples=[s for p in profiles for s in p.decode_samples])


def _medians(figures: list[Figures]) -> Figures:
    """Each field's median over `figures`, all of one type."""
    return type(figures[0])(*(statistics.median(values) for values in zip(*map(dataclasses.astuple, figures))))


def _check_alike(profiles: list[Profile], sources: list[str]) -> None:
    def identity(p: Profile) -> tuple:
        return ({key: p.hardware.get(key) for key in ALIKE_HARDWARE}, {k: v for k, v in p.model.items() if k != "dir"},
                p.max_num_batched_tokens, p.max_num_seqs, p.kv_bytes_per_token, p.serving.cpu.shares_replica_cpus)

    expected = identity(profiles[0])
    for profile, source in zip(profiles[1:], sources[1:]):
        if identity(profile) != expected:
            raise ValueError(f"{source} profiles another model, machine or engine than {sources[0]}: "
                             f"{identity(profile)} against {expected}")
