"""`pdserve serve` with an API key, TLS and an admission bound of one: no key or a wrong one
is a 401 JSON error, the right key gets the offline engine's greedy output over HTTPS, /health
and /metrics answer without a key, plaintext HTTP gets nothing, and a request that arrives while
another streams is a 429 with Retry-After, counted in /metrics, while the streaming one
finishes correctly."""
import json
import urllib.error
from http.client import HTTPException, HTTPSConnection

import pytest

from tests.system.faults.front_clients import (
    completion_body, http, metric, offline_greedy, scrape, self_signed_certificate, start_serve, wait_until)

pytestmark = pytest.mark.faults

KEY = "serve-key"
PROMPT = [8, 6, 7, 5, 30, 9]
MAX_TOKENS = 12
HELD_TOKENS = 600  # long enough to still stream while the second request arrives


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def serve(e2e_model, certificate, tmp_path_factory):
    served = start_serve(e2e_model, tmp_path_factory.mktemp("serve"), "--api-key", KEY,
                         "--tls-cert", str(certificate.cert_path), "--tls-key", str(certificate.key_path),
                         "--max-pending-requests", "1", context=certificate.client_context())
    yield served
    served.stop()


def test_keys_guard_every_route_but_health_and_metrics(serve, certificate, e2e_model):
    context = certificate.client_context()
    for key in (None, "wrong"):
        answer = http(serve.base_url + "/v1/completions", completion_body(PROMPT, MAX_TOKENS), key=key, context=context)
        assert answer.status == 401, answer
        assert answer.json()["error"]["code"] == "invalid_api_key"
    answer = http(serve.base_url + "/v1/completions", completion_body(PROMPT, MAX_TOKENS), key=KEY, context=context)
    assert answer.status == 200, answer
    assert answer.json()["choices"][0]["text"] == offline_greedy(e2e_model, [PROMPT], MAX_TOKENS)[0].text
    assert http(serve.base_url + "/health", context=context).status == 200
    assert metric(scrape(serve.base_url + "/metrics", context=context), "pdserve:http_responses_total",
                  status_code="401") == 2


def test_plaintext_http_gets_nothing(serve):
    with pytest.raises((urllib.error.URLError, HTTPException, ConnectionError)):
        http(serve.base_url.replace("https://", "http://") + "/health", timeout_s=10)


def test_a_request_past_the_bound_is_a_429_while_the_admitted_one_streams_on(serve, certificate):
    context = certificate.client_context()
    host, port = serve.base_url.removeprefix("https://").split(":")
    held = HTTPSConnection(host, int(port), context=context, timeout=60)
    try:
        held.request("POST", "/v1/completions", json.dumps(completion_body(PROMPT, HELD_TOKENS, stream=True)),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        response = held.getresponse()
        assert response.status == 200
        first = response.readline()
        assert first.startswith(b"data: ")  # admitted and streaming
        refused = http(serve.base_url + "/v1/completions", completion_body(PROMPT, 4), key=KEY, context=context)
        rest = response.read().decode()
    finally:
        held.close()
    assert refused.status == 429, refused
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    events = [line.removeprefix("data: ") for line in (first.decode() + rest).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"  # the held one ran to its end

    def settled():
        samples = scrape(serve.base_url + "/metrics", context=context)
        return samples if metric(samples, "pdserve:num_requests_pending") == 0 else None

    samples = wait_until(settled, "the pending gauge to return to 0")
    assert metric(samples, "pdserve:requests_rejected_total", front="http") == 1
    assert metric(samples, "pdserve:num_requests_running") == 0
    assert http(serve.base_url + "/v1/completions", completion_body(PROMPT, 4), key=KEY, context=context).status == 200
