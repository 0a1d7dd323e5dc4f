"""The serving path's speed, read through the launched system itself.

The speed probe (planner/speed.py) times an engine in a process of its own; what a validation
run's requests go through is the gateway, both replicas and the KV handoff. So around each run,
on the launched idle system, `NUM_ANCHORS` single requests of the anchor shape (the profile's
longest single prompt with its shortest output: prefill-bound, as a TTFT is) are sent one at a
time, `SINGLE_GAP_S` apart, as the profile's singles of that shape were; their median TTFT over
the profile singles' median is the machine's served speed at that time, relative to the
profile's (1.0: as fast as when it was profiled, 1.2: 20 % slower). A run's scale is the mean of
the readings just before it and just after it. The anchors are never a run's own requests.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from pdserve.planner.bench_runs import bench, random_requests
from pdserve.planner.profile import Profile
from pdserve.planner.serving import REGULAR_ARRIVALS, SINGLE_GAP_S

NUM_ANCHORS = 5


def anchor_shape(profile: Profile) -> tuple[int, int] | None:
    """(prompt, output) tokens: the profile's longest single prompt, with its shortest output;
    None for a profile that served none (`plan profile --no-serving`), which has no served speed."""
    shapes = {(s["prompt_len"], s["output_len"]) for s in profile.serving.samples if s["kind"] == "single"}
    return max(shapes, key=lambda shape: (shape[0], -shape[1])) if shapes else None


def profile_anchor_ttft_s(profile: Profile) -> float:
    shape = anchor_shape(profile)
    return statistics.median(s["ttft_s"] for s in profile.serving.samples
                             if s["kind"] == "single" and (s["prompt_len"], s["output_len"]) == shape)


def anchor_ttft_s(base_url: str, model_dir: Path, shape: tuple[int, int], seed: int) -> float:
    """The median TTFT of the anchors, read now (fresh prompts for each `seed`)."""
    requests = random_requests(model_dir, NUM_ANCHORS, *shape, seed)
    result = bench(base_url, requests, "served speed", max_concurrency=1, request_rate=1 / SINGLE_GAP_S,
                   burstiness=REGULAR_ARRIVALS, progress=False)
    return statistics.median(record.ttft_s for record in result.records)
