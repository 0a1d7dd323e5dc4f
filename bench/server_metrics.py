"""Server-side figures of a run, from the server's Prometheus `/metrics` endpoint.

The scraper reads the endpoint before the run, every `interval_s` during it and after it. Every
series whose name starts with one of `prefixes` (pdserve's `pdserve:`, vLLM's `vllm:`) is
collected generically, without knowing names in advance:
- counters: the increase over the run;
- histograms and summaries: the increase of their count and sum, and the mean of what was
  observed during the run;
- gauges: mean, max and last value over all scrapes.
When pdserve's KV transfer series are there, the run's KV transfer figures are derived from them:
bytes moved, transfers, GB/s while transferring, bytes per transfer, overall and per transport.
When prefix cache counters are there (pdserve's or vLLM's `prefix_cache_queries` / `_hits`, in
tokens), the run's hit rate is derived from their increases.
A failed scrape is recorded, never raised: the server's figures are extra, the run goes on.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

DEFAULT_PREFIXES = ("pdserve:", "vllm:")
KV_BYTES_COUNTER = "pdserve:kv_transfer_bytes_total"
KV_SECONDS_HISTOGRAM = "pdserve:kv_transfer_seconds"
SCRAPE_TIMEOUT_S = 5.0
MAX_ERRORS_KEPT = 5


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape; series are keyed `name{label="value",...}` with labels sorted."""

    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, tuple[float, float]] = field(default_factory=dict)  # -> (count, sum)
    gauges: dict[str, float] = field(default_factory=dict)


def parse_exposition(text: str, prefixes: tuple[str, ...] = DEFAULT_PREFIXES) -> Snapshot:
    snapshot = Snapshot()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefixes):
            continue
        if family.type == "counter":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    snapshot.counters[_key(sample.name, sample.labels)] = sample.value
        elif family.type in ("histogram", "summary"):
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    key = _key(family.name, sample.labels)
                    snapshot.histograms[key] = (sample.value, snapshot.histograms.get(key, (0.0, 0.0))[1])
                elif sample.name.endswith("_sum"):
                    key = _key(family.name, sample.labels)
                    snapshot.histograms[key] = (snapshot.histograms.get(key, (0.0, 0.0))[0], sample.value)
        elif family.type in ("gauge", "unknown") and not family.name.endswith("_created"):
            for sample in family.samples:
                snapshot.gauges[_key(sample.name, sample.labels)] = sample.value
    return snapshot


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{label}="{value}"' for label, value in sorted(labels.items())) + "}"


def summarise(before: Snapshot, during: list[Snapshot], after: Snapshot) -> dict:
    """The server section of a result: counter and histogram increases, gauge statistics."""
    counters = {key: value - before.counters.get(key, 0.0) for key, value in sorted(after.counters.items())}
    histograms = {}
    for key, (count, total) in sorted(after.histograms.items()):
        count_before, total_before = before.histograms.get(key, (0.0, 0.0))
        num_observed, observed_sum = count - count_before, total - total_before
        histograms[key] = {"count": num_observed, "sum": observed_sum,
                           "mean": observed_sum / num_observed if num_observed else None}
    series: dict[str, list[float]] = {}
    for snapshot in (before, *during, after):
        for key, value in snapshot.gauges.items():
            series.setdefault(key, []).append(value)
    gauges = {key: {"mean": sum(values) / len(values), "max": max(values), "last": values[-1]}
              for key, values in sorted(series.items())}
    return {"counters": counters, "histograms": histograms, "gauges": gauges,
            "kv_transfer": _kv_transfer(counters, histograms), "prefix_cache": _prefix_cache(counters)}


def _prefix_cache(counters: dict[str, float]) -> dict | None:
    """Queried and hit tokens over the run: in all, and per `role` label where pdserve gives one
    (its prefill and decode replicas)."""
    totals: dict[str, list[float]] = {}  # role ("" for all) -> [queried, hit]
    for key, value in counters.items():
        name = key.split("{")[0]
        for index, suffix in enumerate(("prefix_cache_queries_total", "prefix_cache_hits_total")):
            if name.endswith(suffix):
                role = re.search(r'role="([^"]*)"', key)
                for group in ("", *([role.group(1)] if role else [])):
                    totals.setdefault(group, [0.0, 0.0])[index] += value
    if "" not in totals:
        return None

    def figures(queries: float, hits: float) -> dict:
        return {"queried_tokens": queries, "hit_tokens": hits, "hit_rate": hits / queries if queries else None}

    return {**figures(*totals.pop("")), "by_role": {role: figures(*pair) for role, pair in sorted(totals.items())}}


def _kv_transfer(counters: dict[str, float], histograms: dict[str, dict]) -> dict | None:
    """Joins the bytes counter and the seconds histogram on their labels (one series per transport)."""
    by_labels = {}
    for key, num_bytes in counters.items():
        if key.startswith(KV_BYTES_COUNTER):
            labels = key.removeprefix(KV_BYTES_COUNTER)
            timing = histograms.get(KV_SECONDS_HISTOGRAM + labels, {"count": 0.0, "sum": 0.0})
            by_labels[labels] = (num_bytes, timing["count"], timing["sum"])
    if not by_labels:
        return None
    total = tuple(sum(values[i] for values in by_labels.values()) for i in range(3))
    return {**_kv_figures(*total), "by_series": {labels or "{}": _kv_figures(*values)
                                                 for labels, values in sorted(by_labels.items())}}


def _kv_figures(num_bytes: float, num_transfers: float, seconds: float) -> dict:
    return {"bytes": num_bytes, "num_transfers": num_transfers, "transfer_s": seconds,
            "gb_per_s": num_bytes / seconds / 1e9 if seconds > 0 else None,
            "bytes_per_transfer": num_bytes / num_transfers if num_transfers else None}


class MetricsScraper:
    """`start()` before the run, `stop()` after it; `stop()` returns the server section."""

    def __init__(self, url: str, interval_s: float = 0.5, prefixes: tuple[str, ...] = DEFAULT_PREFIXES) -> None:
        self._url = url
        self._interval_s = interval_s
        self._prefixes = prefixes
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._before = Snapshot()
        self._during: list[Snapshot] = []
        self._num_scrapes = 0
        self._errors: list[str] = []

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S))
        self._before = await self._scrape() or Snapshot()
        self._task = asyncio.create_task(self._poll())

    async def stop(self) -> dict:
        await self._stop_polling()
        after = await self._scrape() or Snapshot()
        await self.close()
        return {"metrics_url": self._url, "num_scrapes": self._num_scrapes, "scrape_errors": self._errors,
                **summarise(self._before, self._during, after)}

    async def close(self) -> None:
        """Stops without a last scrape (the run failed); safe to call more than once."""
        await self._stop_polling()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _stop_polling(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            snapshot = await self._scrape()
            if snapshot is not None:
                self._during.append(snapshot)

    async def _scrape(self) -> Snapshot | None:
        try:
            async with self._session.get(self._url) as response:
                if response.status != 200:
                    raise aiohttp.ClientResponseError(response.request_info, (), status=response.status)
                text = await response.text()
            self._num_scrapes += 1
            return parse_exposition(text, self._prefixes)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            if len(self._errors) < MAX_ERRORS_KEPT:
                self._errors.append(f"{type(error).__name__}: {error}")
            return None
