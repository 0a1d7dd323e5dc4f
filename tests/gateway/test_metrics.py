"""GatewayMetrics keeps its own registry and /metrics serves it in Prometheus text format;
the HTTP front counts its responses by route and status."""
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdserve.engine.step_stats import StepStats
from pdserve.gateway.front.metrics import GatewayMetrics, RequestTimeline


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_request_figures_land_in_the_exposition():
    metrics = GatewayMetrics("m")
    metrics.on_request_start()
    metrics.on_request_start()
    metrics.on_first_token(0.05)
    metrics.on_token(0.01)
    metrics.on_token(0.02)
    metrics.on_finish("stop", prompt_tokens=7, completion_tokens=3, e2e_s=0.2)
    metrics.on_preemptions(2)
    metrics.on_kv_transfer("shm", num_bytes=4096, seconds=0.003)

    values = samples(metrics.render().decode())
    model = (("model_name", "m"),)
    assert values[("pdserve:num_requests_running", model)] == 1
    assert values[("pdserve:request_success_total", (("finished_reason", "stop"), ("model_name", "m")))] == 1
    assert values[("pdserve:prompt_tokens_total", model)] == 7
    assert values[("pdserve:generation_tokens_total", model)] == 3
    assert values[("pdserve:num_preemptions_total", model)] == 2
    assert values[("pdserve:time_to_first_token_seconds_count", model)] == 1
    assert values[("pdserve:time_to_first_token_seconds_sum", model)] == 0.05
    assert values[("pdserve:inter_token_latency_seconds_count", model)] == 2
    assert values[("pdserve:e2e_request_latency_seconds_sum", model)] == 0.2
    transport = (("model_name", "m"), ("transport", "shm"))
    assert values[("pdserve:kv_transfer_bytes_total", transport)] == 4096
    assert values[("pdserve:kv_transfer_seconds_count", transport)] == 1


def test_a_finished_request_observes_its_phases_with_vllm_meanings():
    metrics = GatewayMetrics("m")
    timeline = RequestTimeline(arrival_s=10.0, scheduled_s=10.5)
    for now_s in (11.0, 11.25, 12.0):
        timeline.on_token(now_s)
    metrics.on_request_start()
    metrics.on_finish("length", prompt_tokens=7, completion_tokens=3, e2e_s=2.5, timeline=timeline)

    values = samples(metrics.render().decode())
    model = (("model_name", "m"),)
    assert values[("pdserve:request_queue_time_seconds_sum", model)] == 0.5  # arrival -> scheduled
    assert values[("pdserve:request_prefill_time_seconds_sum", model)] == 0.5  # -> first token
    assert values[("pdserve:request_decode_time_seconds_sum", model)] == 1.0  # first -> last token
    assert values[("pdserve:request_inference_time_seconds_sum", model)] == 1.5  # scheduled -> last
    assert values[("pdserve:e2e_request_latency_seconds_sum", model)] == 2.5
    assert values[("pdserve:request_prompt_tokens_sum", model)] == 7
    assert values[("pdserve:request_prompt_tokens_bucket", (("le", "5.0"),) + model)] == 0
    assert values[("pdserve:request_prompt_tokens_bucket", (("le", "10.0"),) + model)] == 1
    assert values[("pdserve:request_generation_tokens_sum", model)] == 3
    assert values[("pdserve:request_generation_tokens_count", model)] == 1


def test_phases_a_request_never_reached_are_not_observed():
    metrics = GatewayMetrics("m")
    for timeline in (RequestTimeline(arrival_s=0.0), RequestTimeline(arrival_s=0.0, scheduled_s=0.25), None):
        metrics.on_request_start()
        metrics.on_finish("abort", prompt_tokens=4, completion_tokens=0, e2e_s=1.0, timeline=timeline)

    values = samples(metrics.render().decode())
    model = (("model_name", "m"),)
    assert values[("pdserve:request_queue_time_seconds_count", model)] == 1
    assert ("pdserve:request_prefill_time_seconds_count", model) not in values
    assert ("pdserve:request_decode_time_seconds_count", model) not in values
    assert values[("pdserve:request_generation_tokens_count", model)] == 3


def test_requests_waiting_are_those_in_the_live_replicas_queues():
    metrics = GatewayMetrics("m")
    replica = dict(total_blocks=10, free_blocks=10, block_size=4, used_slots=0, running_seqs=0,
                   queued_tokens=0, num_preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0,
                   weights_bytes=96 << 20, kv_pool_bytes=1 << 30, resident_bytes=500 << 20, **StepStats().figures())
    metrics.on_replica_loads([
        SimpleNamespace(kind="prefill", replica_id="p0", waiting_seqs=3, **replica),
        SimpleNamespace(kind="decode", replica_id="d0", waiting_seqs=2, **replica),
    ])
    waiting = ("pdserve:num_requests_waiting", (("model_name", "m"),))
    figures = samples(metrics.render().decode())
    assert figures[waiting] == 5
    decode = (("kind", "decode"), ("replica", "d0"))
    assert figures[("pdserve:replica_weights_bytes", decode)] == 96 << 20
    assert figures[("pdserve:replica_kv_pool_bytes", decode)] == 1 << 30
    assert figures[("pdserve:replica_resident_memory_bytes", decode)] == 500 << 20

    metrics.on_replica_loads([])
    assert samples(metrics.render().decode())[waiting] == 0
    metrics.set_num_requests_waiting(4)
    assert samples(metrics.render().decode())[waiting] == 4


def test_a_single_engine_publishes_its_load_as_the_engine_replica():
    metrics = GatewayMetrics("m")
    metrics.on_engine_load(dict(total_blocks=10, free_blocks=6, block_size=4, used_slots=12, running_seqs=2,
                                waiting_seqs=1, num_preemptions=0, prefix_cache_queries=40, prefix_cache_hits=8,
                                weights_bytes=146 << 20, kv_pool_bytes=1 << 30, resident_bytes=700 << 20,
                                **StepStats().figures()))
    figures = samples(metrics.render().decode())
    engine = (("kind", "engine"), ("replica", ""))
    assert figures[("pdserve:replica_weights_bytes", engine)] == 146 << 20
    assert figures[("pdserve:replica_kv_pool_bytes", engine)] == 1 << 30
    assert figures[("pdserve:replica_resident_memory_bytes", engine)] == 700 << 20
    assert figures[("pdserve:kv_cache_usage_perc", engine)] == pytest.approx(0.4)
    assert figures[("pdserve:kv_cache_waste_perc", engine)] == pytest.approx(0.25)  # 12 of 16 slots hold a token
    assert figures[("pdserve:num_requests_waiting", (("model_name", "m"),))] == 1
    hits = ("pdserve:prefix_cache_hits_total", (("model_name", "m"), ("role", "engine")))
    assert figures[hits] == 8


def test_each_replica_publishes_what_its_steps_did_by_kind():
    metrics = GatewayMetrics("m")
    stats = StepStats()
    stats.observe(num_decodes=0, num_prompt_tokens=300, seconds=0.25)
    stats.observe(num_decodes=6, num_prompt_tokens=30, seconds=0.07)
    stats.observe(num_decodes=6, num_prompt_tokens=0, seconds=0.02)
    load = dict(total_blocks=10, free_blocks=10, block_size=4, used_slots=0, running_seqs=0, waiting_seqs=0,
                queued_tokens=0, num_preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0, weights_bytes=0,
                kv_pool_bytes=0, resident_bytes=0)
    metrics.on_replica_loads([SimpleNamespace(kind="decode", replica_id="d0", **load, **stats.figures())])
    figures = samples(metrics.render().decode())
    decode = (("kind", "decode"), ("replica", "d0"))
    steps = {kind: figures[("pdserve:replica_engine_steps", (*decode, ("step", kind)))]
             for kind in ("decode", "mixed", "prompt")}
    assert steps == {"decode": 1, "mixed": 1, "prompt": 1}
    assert figures[("pdserve:replica_engine_step_seconds", (*decode, ("step", "mixed")))] == pytest.approx(0.07)
    tokens = {phase: figures[("pdserve:replica_computed_tokens", (decode[0], ("phase", phase), decode[1]))]
              for phase in ("prompt", "decode")}
    assert tokens == {"prompt": 330, "decode": 12}

    metrics.on_replica_loads([])  # the replica went away: its figures go with it
    assert not any(name.startswith("pdserve:replica_") for name, _ in samples(metrics.render().decode()))


def test_prefix_cache_counters_add_what_each_replica_counted_since_its_last_report():
    metrics = GatewayMetrics("m")
    load = dict(total_blocks=10, free_blocks=10, block_size=4, used_slots=0, running_seqs=0, waiting_seqs=0,
                queued_tokens=0, num_preemptions=0, weights_bytes=0, kv_pool_bytes=0, resident_bytes=0,
                **StepStats().figures())

    def report(**counts):  # replica id -> (queried tokens, hit tokens) since it started
        metrics.on_replica_loads([SimpleNamespace(kind="prefill", replica_id=name, prefix_cache_queries=queries,
                                                  prefix_cache_hits=hits, **load)
                                  for name, (queries, hits) in counts.items()])
        figures = samples(metrics.render().decode())
        return tuple(figures[(f"pdserve:prefix_cache_{kind}_total", (("model_name", "m"), ("role", "prefill")))]
                     for kind in ("queries", "hits"))

    assert report(p0=(100, 40), p1=(50, 0)) == (150, 40)
    assert report(p0=(100, 40), p1=(80, 16)) == (180, 56)  # the same report of p0 again adds nothing
    assert report(p0=(30, 30), p1=(80, 16)) == (210, 86)  # p0 restarted: counting from zero again


def test_each_instance_has_its_own_registry():
    first, second = GatewayMetrics("m"), GatewayMetrics("m")
    first.on_request_start()

    running = ("pdserve:num_requests_running", (("model_name", "m"),))
    assert samples(second.render().decode()).get(running) in (None, 0)


def test_an_unknown_finish_reason_is_refused():
    with pytest.raises(ValueError, match="'done'"):
        GatewayMetrics("m").on_finish("done", prompt_tokens=1, completion_tokens=1, e2e_s=0.1)


def test_metrics_endpoint_counts_responses_by_route_and_status(server):
    server.request("POST", "/v1/completions", json_body={"model": "nope", "prompt": "hi"})
    server.request("POST", "/v1/completions", json_body={"prompt": "hi", "max_tokens": 1})
    server.request("GET", "/no/such/path")

    response = server.request("GET", "/metrics")

    assert response.status == 200
    assert response.content_type.startswith("text/plain")
    values = samples(response.text)
    assert values[("pdserve:http_responses_total", (("route", "/v1/completions"), ("status_code", "404")))] == 1
    assert values[("pdserve:http_responses_total", (("route", "/v1/completions"), ("status_code", "200")))] == 1
    assert values[("pdserve:http_responses_total", (("route", "unmatched"), ("status_code", "404")))] == 1
