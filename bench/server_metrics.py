"""The server's own figures over a run, from its Prometheus `/metrics` endpoint.

Scraped before and after the run: every series named with one of `PREFIXES` (pdserve's, vLLM's,
llama.cpp's), a counter as its increase, a histogram or summary as the increase of its count and
sum and the mean observed, a gauge as its value after the run (a replica's resident memory, say)
and its change over the run where it was there before too (a figure a replica counts since it
started and reports as a gauge: its engine's busy seconds, say).
A failed scrape is recorded, never raised: the run goes on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

PREFIXES = ("pdserve:", "vllm:", "llamacpp:")
SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape; series are keyed `name{label="value",...}` with labels sorted."""

    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, tuple[float, float]] = field(default_factory=dict)  # -> (count, sum)
    gauges: dict[str, float] = field(default_factory=dict)


def parse_exposition(text: str) -> Snapshot:
    snapshot = Snapshot()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIXES):
            continue
        for sample in family.samples:
            labels = ",".join(f'{label}="{value}"' for label, value in sorted(sample.labels.items()))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            if family.type == "counter" and sample.name.endswith("_total"):
                snapshot.counters[key] = sample.value
            elif family.type == "gauge" and not sample.name.endswith("_created"):  # not a counter's start time
                snapshot.gauges[key] = sample.value
            elif family.type in ("histogram", "summary") and sample.name.endswith(("_count", "_sum")):
                key = f"{family.name}{{{labels}}}" if labels else family.name
                count, total = snapshot.histograms.get(key, (0.0, 0.0))
                is_count = sample.name.endswith("_count")
                snapshot.histograms[key] = (sample.value if is_count else count, total if is_count else sample.value)
    return snapshot


def summarise(before: Snapshot, after: Snapshot) -> dict:
    """Counter increases and histogram increases (count, sum, mean) from `before` to `after`, the
    gauges of `after`, and the change of those that `before` has too."""
    counters = {key: value - before.counters.get(key, 0.0) for key, value in sorted(after.counters.items())}
    histograms = {}
    for key, (count, total) in sorted(after.histograms.items()):
        count_before, total_before = before.histograms.get(key, (0.0, 0.0))
        num_observed, observed_sum = count - count_before, total - total_before
        histograms[key] = {"count": num_observed, "sum": observed_sum,
                           "mean": observed_sum / num_observed if num_observed else None}
    gauge_changes = {key: value - before.gauges[key] for key, value in sorted(after.gauges.items())
                     if key in before.gauges}
    return {"counters": counters, "histograms": histograms, "gauges": dict(sorted(after.gauges.items())),
            "gauge_changes": gauge_changes}


async def scrape(url: str) -> Snapshot | str:
    """One scrape of `url`, or why it failed."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as session:
            async with session.get(url) as response:
                response.raise_for_status()
                return parse_exposition(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        return f"{type(error).__name__}: {error}"


def server_section(url: str, before: Snapshot | str, after: Snapshot | str) -> dict:
    """A result's "server" section: the figures, or the scrape errors where there are none."""
    errors = [snapshot for snapshot in (before, after) if isinstance(snapshot, str)]
    return {"metrics_url": url, "scrape_errors": errors, **({} if errors else summarise(before, after))}
