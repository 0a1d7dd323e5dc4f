"""GatewayMetrics keeps its own registry and /metrics serves it in Prometheus text format;
the HTTP front counts its responses by route and status."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics


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
