"""The server's own figures over a run, from its Prometheus `/metrics` endpoint.

Scraped once before the run and once after it. Every series whose name starts with one of
`PREFIXES` (pdserve's, vLLM's, llama.cpp's) is collected without knowing names in advance: a
counter as its increase over the run; a histogram or summary as the increase of its count and
sum, and the mean of what was observed during the run. A failed scrape is recorded, never
raised: the server's figures are extra, the run goes on.
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


def parse_exposition(text: str) -> Snapshot:
    snapshot = Snapshot()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIXES):
            continue
        for sample in family.samples:
            if family.type == "counter" and sample.name.endswith("_total"):
                snapshot.counters[_key(sample.name, sample.labels)] = sample.value
            elif family.type in ("histogram", "summary") and sample.name.endswith(("_count", "_sum")):
                key = _key(family.name, sample.labels)
                count, total = snapshot.histograms.get(key, (0.0, 0.0))
                snapshot.histograms[key] = (sample.value, total) if sample.name.endswith("_count") else (count,
                                                                                                         sample.value)
    return snapshot


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{label}="{value}"' for label, value in sorted(labels.items())) + "}"


def summarise(before: Snapshot, after: Snapshot) -> dict:
    """Counter increases and histogram increases (count, sum, mean) from `before` to `after`."""
    counters = {key: value - before.counters.get(key, 0.0) for key, value in sorted(after.counters.items())}
    histograms = {}
    for key, (count, total) in sorted(after.histograms.items()):
        count_before, total_before = before.histograms.get(key, (0.0, 0.0))
        num_observed, observed_sum = count - count_before, total - total_before
        histograms[key] = {"count": num_observed, "sum": observed_sum,
                           "mean": observed_sum / num_observed if num_observed else None}
    return {"counters": counters, "histograms": histograms}


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
