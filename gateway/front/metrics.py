"""The gateway's Prometheus metrics, in a registry of their own (no process-global state).

Who records what, so that nothing is counted twice:
- the gateway core (the `Frontend` behind both the HTTP and the gRPC front) records every
  request-level figure: `on_request_start` / `on_finish` exactly once per admitted request,
  `on_first_token` and `on_token` as tokens arrive, `on_preemptions` and `on_kv_transfer` from
  what the replicas report, `on_migration` each time a request moves off a failed replica;
- the HTTP front records only `on_http_response`, one per HTTP response, which also counts the
  requests rejected before they reached the core.

Names and units follow vLLM's (`vllm:time_to_first_token_seconds` becomes
`pdserve:time_to_first_token_seconds`), so dashboards built for it need only the prefix changed.
A request's phases are measured on the front's clock (`RequestTimeline`), as vLLM's are:

    arrival ──queue──▶ scheduled ──prefill──▶ first token ──decode──▶ last token
            ◀────────────────────────── e2e ───────────────────────────────▶
                       ◀──────────────── inference ──────────────────▶

"Scheduled" is when the front hands the prompt to the engine that prefills it: in the
disaggregated gateway, the Prefill.Run call after routing and the decode reservation; in
`pdserve serve`, the engine accepting the request. So queue time is what the front waited before
any engine had the request; a wait inside a replica's own scheduler, which no replica reports
per request, lands in prefill time, and shows as `num_requests_waiting` (the sum of the live
replicas' waiting queues, or the engine's own in `pdserve serve`).
"""
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from pdserve.protocol.step_kinds import STEP_KINDS

PREFIX = "pdserve:"

FINISH_REASONS = ("stop", "length", "abort", "error")
"""Values `on_finish` accepts; "error" is a request that failed after it was admitted."""

MIGRATION_REASONS = ("decode_unavailable", "prefill_unavailable", "kv_transfer_failed")

LATENCY_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)
INTER_TOKEN_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
)
TOKEN_COUNT_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))
"""vLLM's 1-2-5 series for per-request token counts, here up to five million."""


@dataclass(slots=True)
class RequestTimeline:
    """One request's moments on the front's monotonic clock, in seconds; None until reached.

    The driver of a request owns it and fills it in as the request advances.
    """

    arrival_s: float
    scheduled_s: float | None = None  # handed to the engine that prefills it
    first_token_s: float | None = None
    last_token_s: float | None = None

    def on_token(self, now_s: float) -> None:
        if self.first_token_s is None:
            self.first_token_s = now_s
        self.last_token_s = now_s


class GatewayMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        model = ("model_name",)
        self._model_name = model_name

        def counter(name: str, doc: str, labels: tuple[str, ...] = model) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...], labels=model) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=self.registry)

        self._running = Gauge(
            PREFIX + "num_requests_running", "Requests admitted and not yet finished.", model,
            registry=self.registry,
        )
        self._finished = counter(
            "request_success", "Finished requests by finish reason.", model + ("finished_reason",)
        )
        self._prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self._generation_tokens = counter("generation_tokens", "Tokens generated.")
        self._preemptions = counter("num_preemptions", "Times a decode replica preempted a request.")
        engine_role = model + ("role",)  # "prefill", "decode", or "engine" for the front's own
        self._prefix_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the engines' prefix caches.", engine_role)
        self._prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the engines' prefix caches.", engine_role)
        self._prefix_counts_seen: dict[tuple[str, str], tuple[int, int]] = {}  # replica -> (queries, hits)
        self._migrations = counter(
            "request_migrations", "Times a request moved off a replica that failed it: one that went away, by its "
            "kind, or a decode replica that failed its KV transfer.",
            model + ("reason",)
        )
        self._prefill_placements = counter(
            "prefill_placements", "Prompts prefilled, by where: a prefill replica (remote) or the decode replica (local).",
            model + ("where",))
        self._ttft_s = histogram(
            "time_to_first_token_seconds", "Arrival to first token.", LATENCY_BUCKETS_S
        )
        self._itl_s = histogram(
            "inter_token_latency_seconds", "Time between consecutive tokens.", INTER_TOKEN_BUCKETS_S
        )
        self._e2e_s = histogram(
            "e2e_request_latency_seconds", "Arrival to the end of the request.", LATENCY_BUCKETS_S
        )
        self._waiting = Gauge(
            PREFIX + "num_requests_waiting", "Requests waiting in the engines' queues.", model,
            registry=self.registry,
        )
        self._queue_s = histogram(
            "request_queue_time_seconds", "Arrival to scheduled (handed to the prefilling engine).",
            LATENCY_BUCKETS_S,
        )
        self._prefill_s = histogram(
            "request_prefill_time_seconds", "Scheduled to first token.", LATENCY_BUCKETS_S
        )
        self._decode_s = histogram(
            "request_decode_time_seconds", "First token to last token.", LATENCY_BUCKETS_S
        )
        self._inference_s = histogram(
            "request_inference_time_seconds", "Scheduled to last token.", LATENCY_BUCKETS_S
        )
        self._request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens per finished request.", TOKEN_COUNT_BUCKETS
        )
        self._request_generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens per finished request.", TOKEN_COUNT_BUCKETS
        )
        transport = model + ("transport",)
        self._kv_bytes = counter("kv_transfer_bytes", "KV cache bytes moved prefill to decode.", transport)
        self._kv_s = histogram(
            "kv_transfer_seconds", "Duration of one request's KV transfer.", LATENCY_BUCKETS_S, transport
        )
        replica = ("kind", "replica")
        self._replica_gauges = {
            field: Gauge(PREFIX + name, doc, replica, registry=self.registry)
            for field, name, doc in (
                ("kv_usage", "kv_cache_usage_perc", "Fraction of a replica's KV blocks in use."),
                ("kv_waste", "kv_cache_waste_perc", "Fraction of allocated KV slots holding no token."),
                ("running_seqs", "replica_num_requests_running", "Requests in a replica's running batch."),
                ("waiting_seqs", "replica_num_requests_waiting", "Requests waiting in a replica's queue."),
                ("queued_tokens", "replica_queued_prompt_tokens", "Prompt tokens queued at a prefill replica."),
                ("num_preemptions", "replica_num_preemptions", "Preemptions since the replica started."),
                ("weights_bytes", "replica_weights_bytes", "Memory a replica's weights take, in bytes."),
                ("kv_pool_bytes", "replica_kv_pool_bytes", "Memory a replica's KV pool takes, in bytes."),
                ("resident_bytes", "replica_resident_memory_bytes",
                 "Resident memory (RSS) of a replica's process, in bytes."),
            )
        }
        # What each replica's engine steps did since it started (engine/step_stats.py), by kind of step.
        self._replica_steps = {
            unit: Gauge(PREFIX + name, doc, replica + ("step",), registry=self.registry)
            for unit, name, doc in (
                ("steps", "replica_engine_steps", "Engine steps a replica ran since it started, by kind: "
                                                  "decode, mixed (prompt chunks with decodes) or prompt."),
                ("steps_s", "replica_engine_step_seconds", "Seconds a replica's engine spent in steps of "
                                                           "each kind since it started."),
            )
        }
        self._replica_computed_tokens = Gauge(
            PREFIX + "replica_computed_tokens", "Tokens a replica's engine computed since it started, by "
            "phase: prompt (recomputed ones included) or decode.", replica + ("phase",), registry=self.registry)
        self._http_responses = Counter(
            PREFIX + "http_responses", "HTTP responses by route and status code.",
            ("route", "status_code"), registry=self.registry,
        )

    def on_request_start(self) -> None:
        self._running.labels(self._model_name).inc()

    def on_first_token(self, ttft_s: float) -> None:
        self._ttft_s.labels(self._model_name).observe(ttft_s)

    def on_token(self, itl_s: float) -> None:
        """One generated token after the first, `itl_s` after the one before it."""
        self._itl_s.labels(self._model_name).observe(itl_s)

    def on_finish(
        self, reason: str, prompt_tokens: int, completion_tokens: int, e2e_s: float,
        timeline: RequestTimeline | None = None,
    ) -> None:
        """Once per admitted request; each phase of `timeline` it reached is observed."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish reason {reason!r} is not one of {FINISH_REASONS}")
        model = self._model_name
        self._running.labels(model).dec()
        self._finished.labels(model, reason).inc()
        self._prompt_tokens.labels(model).inc(prompt_tokens)
        self._generation_tokens.labels(model).inc(completion_tokens)
        self._request_prompt_tokens.labels(model).observe(prompt_tokens)
        self._request_generation_tokens.labels(model).observe(completion_tokens)
        self._e2e_s.labels(model).observe(e2e_s)
        if timeline is None or timeline.scheduled_s is None:
            return
        self._queue_s.labels(model).observe(timeline.scheduled_s - timeline.arrival_s)
        if timeline.first_token_s is None:
            return
        self._prefill_s.labels(model).observe(timeline.first_token_s - timeline.scheduled_s)
        self._decode_s.labels(model).observe(timeline.last_token_s - timeline.first_token_s)
        self._inference_s.labels(model).observe(timeline.last_token_s - timeline.scheduled_s)

    def set_num_requests_waiting(self, num_waiting: int) -> None:
        """For a front over one engine: its scheduler's waiting queue (any thread may call)."""
        self._waiting.labels(self._model_name).set(num_waiting)

    def on_prefix_cache_counts(self, source: tuple[str, str], num_queried_tokens: int, num_hit_tokens: int) -> None:
        """An engine's prefix cache counts since it started, from `source`: a replica's
        `(kind, replica_id)`, or `("engine", "")` for the front's own. The counters grow by what is
        new since its last report; a count that went down is a restarted engine counting from zero."""
        last_queries, last_hits = self._prefix_counts_seen.get(source, (0, 0))
        if num_queried_tokens < last_queries:
            last_queries, last_hits = 0, 0
        role = source[0]
        self._prefix_queries.labels(self._model_name, role).inc(num_queried_tokens - last_queries)
        self._prefix_hits.labels(self._model_name, role).inc(max(0, num_hit_tokens - last_hits))
        self._prefix_counts_seen[source] = (num_queried_tokens, num_hit_tokens)

    def on_preemptions(self, num_preemptions: int) -> None:
        self._preemptions.labels(self._model_name).inc(num_preemptions)

    def on_migration(self, reason: str) -> None:
        """`reason`: one of MIGRATION_REASONS (gateway.disaggregated.migration.blame)."""
        if reason not in MIGRATION_REASONS:
            raise ValueError(f"migration reason {reason!r} is not one of {MIGRATION_REASONS}")
        self._migrations.labels(self._model_name, reason).inc()

    def on_prefill_placed(self, where: str) -> None:
        """`where`: "remote" or "local"."""
        self._prefill_placements.labels(self._model_name, where).inc()

    def on_kv_transfer(self, transport: str, num_bytes: int, seconds: float) -> None:
        self._kv_bytes.labels(self._model_name, transport).inc(num_bytes)
        self._kv_s.labels(self._model_name, transport).observe(seconds)

    def on_replica_loads(self, replicas) -> None:
        """Publishes the live replicas' last reported load (`ReplicaInfo`s); drops the others.
        Requests waiting are those in any live replica's queue."""
        for gauge in (*self._replica_gauges.values(), *self._replica_steps.values(), self._replica_computed_tokens):
            gauge.clear()
        self.set_num_requests_waiting(sum(replica.waiting_seqs for replica in replicas))
        for replica in replicas:
            self._publish_load(replica)

    def on_engine_load(self, load: Mapping[str, int]) -> None:
        """For a front over one engine (`LLMEngine.load()`): its load as the replica gauges of
        ("engine", ""), its waiting queue and its prefix cache counts."""
        self.set_num_requests_waiting(load["waiting_seqs"])
        self._publish_load(SimpleNamespace(kind="engine", replica_id="", queued_tokens=0, **load))

    def _publish_load(self, replica) -> None:
        allocated_slots = (replica.total_blocks - replica.free_blocks) * replica.block_size
        values = {
            "kv_usage": 1 - replica.free_blocks / replica.total_blocks if replica.total_blocks else 0.0,
            "kv_waste": 1 - replica.used_slots / allocated_slots if allocated_slots else 0.0,
            **{field: getattr(replica, field) for field in ("running_seqs", "waiting_seqs", "queued_tokens",
                                                            "num_preemptions", "weights_bytes", "kv_pool_bytes",
                                                            "resident_bytes")},
        }
        for field, value in values.items():
            self._replica_gauges[field].labels(replica.kind, replica.replica_id).set(value)
        for kind in STEP_KINDS:
            for unit, gauge in self._replica_steps.items():
                gauge.labels(replica.kind, replica.replica_id, kind).set(getattr(replica, f"{kind}_{unit}"))
        for phase in ("prompt", "decode"):
            self._replica_computed_tokens.labels(replica.kind, replica.replica_id, phase).set(
                getattr(replica, f"computed_{phase}_tokens"))
        self.on_prefix_cache_counts((replica.kind, replica.replica_id), replica.prefix_cache_queries,
                                    replica.prefix_cache_hits)

    def on_http_response(self, route: str, status_code: int) -> None:
        """`route` is the matched route pattern (bounded cardinality), never the raw path."""
        self._http_responses.labels(route, str(status_code)).inc()

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE_LATEST

    def render(self) -> bytes:
        """All metrics in the Prometheus text exposition format."""
        return generate_latest(self.registry)
