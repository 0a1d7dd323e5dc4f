"""An earlier validation's runs predicted again with another profile, without running them.

`plan validate` (planner/validate.py) keeps in each row what its predictions were made from:
every run's trace and times (`records`: send time, prompt and output lengths, TTFT, E2EL), the
machine's speed read around each run (`at_speed.references_s`), the served speed around it
(`at_served_speed`: each run's anchor TTFT as a scale of the profile's) and each run's CPU. A
replay predicts the same traces with another profile (a pooled one, planner/pool.py, or a
changed simulation) against the same measured figures, in a minute rather than a validation's
quarter of an hour: a check of the model against runs already made, never a new measurement.

Invariant: a validation replayed with the profile it ran with gives its rows back as they were.
"""
from __future__ import annotations

from pdserve.bench.records import RequestRecord
from pdserve.planner.profile import Profile
from pdserve.planner.served_speed import anchor_shape, profile_anchor_ttft_s
from pdserve.planner.simulate import XpYd
from pdserve.planner.validate import compare_row
from pdserve.planner.workload import Slo


def replay(profile: Profile, validation: dict) -> list[dict]:
    """`validation`: what `plan validate` wrote (validation.json); its rows predicted with `profile`."""
    slo = Slo(**validation["slo"])
    return [{**compare_row(profile, XpYd.parse(row["config"]), row["request_rate"], _runs(row), slo,
                           _cpu_s_per_s(row), row.get("at_speed", {}).get("references_s"),
                           _served_scales(profile, row)),
             "load_average_1m": row["load_average_1m"]} for row in validation["rows"]]


def _runs(row: dict) -> list[list[RequestRecord]]:
    return [[RequestRecord(prompt_len=prompt_len, output_len=output_len, ttft_s=ttft_s, itl_s=[], e2el_s=e2el_s,
                           success=True, error="", start_s=start_s)
             for start_s, prompt_len, output_len, ttft_s, e2el_s in records] for records in row["records"]]


def _cpu_s_per_s(row: dict) -> list[dict[str, float]] | None:
    runs = row["measured_runs"]
    return [run["cpu_s_per_s"] for run in runs] if all("cpu_s_per_s" in run for run in runs) else None


def _served_scales(profile: Profile, row: dict) -> list[float] | None:
    """Each run's anchor TTFT, read as a scale of the validated profile's, over `profile`'s."""
    served = row.get("at_served_speed")
    if served is None or anchor_shape(profile) is None:
        return None
    ratio = served["profile_anchor_ttft_s"] / profile_anchor_ttft_s(profile)
    return [scale * ratio for scale in served["scales"]]
