"""`run_benchmark`: send a dataset to a server on a schedule and measure every request.

Each request waits for its arrival offset, then for a slot under `max_concurrency` (queueing at
the client, as in vLLM), then streams through the backend's client while `time_stream` times it.
The run spans the first send to the last answer; a request that fails or outlives `timeout_s` is
a failed record, so the run never hangs on it. With `metrics_url` the server's Prometheus figures
are scraped before and after the run.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from tqdm import tqdm

from pdserve.bench.client import CompletionsClient
from pdserve.bench.datasets import BenchRequest, arrival_offsets_s
from pdserve.bench.errors import BenchConfigError
from pdserve.bench.metrics import BenchMetrics, compute_metrics, validate_slos
from pdserve.bench.records import RequestRecord, time_stream
from pdserve.bench.server_metrics import scrape, server_section
from pdserve.bench.systems import Served

BACKENDS = ("openai", "grpc")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    target: str                       # "http://host:port/v1" (openai) or "host:port" (grpc)
    backend: str = "openai"           # one of BACKENDS
    model: str | None = None          # openai's model id; None = the first of GET /v1/models
    request_rate: float = math.inf    # requests/s; inf sends all at once
    max_concurrency: int | None = None
    seed: int = 0
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)  # "ttft" | "tpot" | "e2el"
    metrics_url: str | None = None    # a Prometheus /metrics URL
    timeout_s: float = 600.0          # per request
    label: str = "pdserve-bench"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise BenchConfigError(f"backend {self.backend!r} is not one of {BACKENDS}")
        arrival_offsets_s(0, self.request_rate, self.seed)  # refuses a bad rate
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BenchConfigError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        validate_slos(self.goodput_slos_ms)

    def create_client(self):
        """The backend's client; gRPC is imported only when picked, so an openai run loads none."""
        if self.backend == "grpc":
            from pdserve.bench.backend_grpc import GatewayClient
            return GatewayClient(self.target)
        return CompletionsClient(self.target, self.model)


@dataclass
class BenchResult:
    config: BenchConfig
    model_id: str
    date: str                         # ISO 8601, UTC, when the run started
    records: list[RequestRecord]      # in dataset order
    metrics: BenchMetrics
    server: dict | None               # scraped figures and per-request summary; None when neither

    def to_json_dict(self) -> dict:
        """vLLM `bench serve`'s result fields, then ours ("e2els", "server")."""
        config = {**dataclasses.asdict(self.config), "request_rate": "inf" if math.isinf(self.config.request_rate)
                  else self.config.request_rate}
        return {"date": self.date, "label": config.pop("label"), "model_id": self.model_id,
                "num_prompts": len(self.records), **config, **self.metrics.to_dict(),
                "input_lens": [record.prompt_len for record in self.records],
                "output_lens": [record.output_len for record in self.records],
                "ttfts": [record.ttft_s for record in self.records], "itls": [record.itl_s for record in self.records],
                "errors": [record.error for record in self.records],
                "e2els": [record.e2el_s for record in self.records], "server": self.server}


async def run_benchmark(config: BenchConfig, requests: list[BenchRequest], progress: bool = True) -> BenchResult:
    if not requests:
        raise BenchConfigError("the benchmark needs at least one request")
    offsets_s = arrival_offsets_s(len(requests), config.request_rate, config.seed)
    client = config.create_client()
    request_ids = [f"bench-{uuid.uuid4().hex[:8]}-{index}" for index in range(len(requests))]
    slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else contextlib.nullcontext()
    try:
        model_id = await client.open()
        before = await scrape(config.metrics_url) if config.metrics_url else None
        date = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with tqdm(total=len(requests), disable=not progress, desc=config.label, unit="req") as bar:
            started_at = time.perf_counter()

            async def send(index: int, request: BenchRequest) -> RequestRecord:
                await asyncio.sleep(max(0.0, started_at + offsets_s[index] - time.perf_counter()))
                async with slots:
                    record = await time_stream(client.stream(request, request_ids[index]),
                                               known_prompt_len=len(request.prompt_token_ids or []) or None,
                                               timeout_s=config.timeout_s, start_s=time.perf_counter() - started_at)
                bar.update(1)
                return record

            records = list(await asyncio.gather(*(send(i, r) for i, r in enumerate(requests))))
            duration_s = time.perf_counter() - started_at
        server = server_section(config.metrics_url, before, await scrape(config.metrics_url)) \
            if config.metrics_url else {}
        if (described := await client.describe(request_ids)) is not None:
            server["requests"] = described
    finally:
        await client.close()
    return BenchResult(config=config, model_id=model_id, date=date, records=records,
                       metrics=compute_metrics(records, duration_s, config.goodput_slos_ms), server=server or None)


def run_on(served: Served, requests: list[BenchRequest], label: str, *, progress: bool = False,
           scrape: bool = False, **options) -> BenchResult:
    """`requests` sent to a started system over the backend it was started for; `options` are
    BenchConfig's; `scrape` reads its /metrics."""
    config = BenchConfig(target=served.target, backend=served.backend, model=served.model_id, label=label,
                         metrics_url=served.spec.metrics_url if scrape else None, **options)
    return asyncio.run(run_benchmark(config, requests, progress))
