"""The official `openai` client, unchanged, against the gateway's HTTP front backed by real
prefill and decode replicas."""
import asyncio
import socket

import grpc
import openai
import pytest

from pdserve.engine import LLM, SamplingParams
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.helpers import ENGINE_OPTIONS

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster([("decode", "d0", ()), ("prefill", "p0", ()), ("gateway", "gw", ())])


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.gateway.http_port}/v1", api_key="unused",
                         timeout=60, max_retries=0)


def grpc_greedy_text(cluster, prompt: str, max_tokens: int) -> str:
    async def go():
        async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(prompt=prompt, params=common_pb2.SamplingParams(
                max_tokens=max_tokens, temperature=0, ignore_eos=True))
            return "".join([chunk.text async for chunk in stub.Generate(request, timeout=60)])
    return asyncio.run(go())


def test_models_lists_the_served_model(client):
    assert [model.id for model in client.models.list().data] == ["model0"]


def test_streamed_completion_equals_the_grpc_greedy_text(client, cluster):
    stream = client.completions.create(model="model0", prompt="The quick brown fox", max_tokens=12,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True},
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(choice.text for chunk in chunks for choice in chunk.choices)
    assert text == grpc_greedy_text(cluster, "The quick brown fox", 12)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12
    cluster.assert_all_kv_free()


def test_streamed_chat_completion(client, cluster):
    stream = client.chat.completions.create(
        model="model0", messages=[{"role": "user", "content": "Say something."}], max_tokens=10,
        temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text and chunks[-1].choices[0].finish_reason in ("stop", "length")
    cluster.assert_all_kv_free()


def test_whole_completion_with_logprobs_and_a_stop_string(client, cluster):
    full = grpc_greedy_text(cluster, "Once upon a time", 20)
    stop = full[5:8]
    response = client.completions.create(model="model0", prompt="Once upon a time", max_tokens=20,
                                         temperature=0, logprobs=2, stop=[stop], extra_body={"ignore_eos": True})
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == full[:full.index(stop)]
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    cluster.assert_all_kv_free()


def test_penalised_seeded_completion_equals_the_offline_engine(client, cluster, e2e_model):
    # What `vllm bench serve` sends, plus every adjustment; values exact in float32, the wire's type.
    adjustments = dict(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.25, min_tokens=4)
    llm = LLM(e2e_model, **ENGINE_OPTIONS)
    banned = llm.generate(["penalties"], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)[0]
    bias = {banned.outputs[0].token_ids[0]: -100.0, 7: 2.5}
    response = client.completions.create(
        model="model0", prompt="penalties", max_tokens=12, temperature=0.8, seed=99, logit_bias=bias,
        presence_penalty=0.5, frequency_penalty=0.25,
        extra_body={"repetition_penalty": 1.25, "min_tokens": 4, "ignore_eos": True})
    expected = llm.generate(["penalties"], SamplingParams(max_tokens=12, temperature=0.8, seed=99, logit_bias=bias,
                                                          ignore_eos=True, **adjustments), use_tqdm=False)[0]
    assert response.choices[0].text == expected.outputs[0].text
    assert response.usage.completion_tokens == 12
    cluster.assert_all_kv_free()


def test_http_client_that_disconnects_mid_stream_frees_its_blocks(cluster):
    body = ('{"model": "model0", "prompt": "tell me everything", "max_tokens": 1500, "stream": true, '
            '"ignore_eos": true}')
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}")
    with socket.create_connection(("127.0.0.1", cluster.gateway.http_port), timeout=30) as sock:
        sock.sendall(request.encode())
        received = b""
        while received.count(b"data:") < 3:
            received += sock.recv(4096)
    cluster.assert_all_kv_free()


def test_invalid_request_is_a_400_with_a_json_error(client):
    with pytest.raises(openai.BadRequestError) as failure:
        client.completions.create(model="model0", prompt="x", temperature=-1)
    assert "temperature" in failure.value.message
    with pytest.raises(openai.BadRequestError) as failure:
        client.completions.create(model="model0", prompt="x", logit_bias={"100000000": 1})
    assert "logit_bias" in failure.value.message  # the vocabulary is checked by the replicas


def test_metrics_export_each_live_replicas_load(cluster):
    import urllib.request

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.gateway.http_port}/metrics", timeout=10) as response:
            return response.read().decode()

    grpc_greedy_text(cluster, "hello", 2)  # moves KV once, whichever tests ran before
    expected = ('pdserve:kv_cache_usage_perc{kind="decode",replica="d0"}',
                'pdserve:replica_queued_prompt_tokens{kind="prefill",replica="p0"}',
                'pdserve:kv_transfer_bytes_total{model_name="model0",transport="TRANSPORT_SHM"}')

    def shows_all() -> bool:  # in one scrape: each replica's gauges follow its own heartbeats
        text = scrape()
        return all(series in text for series in expected)

    cluster.wait_until(shows_all, f"{', '.join(expected)} in /metrics")


def test_n_choices_sample_like_separate_requests_with_seed_plus_index(client, cluster):
    def sample(seed: int, n: int = 1) -> list[str]:
        response = client.completions.create(model="model0", prompt="Pick a word", max_tokens=8, temperature=1.0,
                                             seed=seed, n=n, extra_body={"ignore_eos": True})
        return [choice.text for choice in response.choices]

    assert sample(seed=40, n=3) == sample(40) + sample(41) + sample(42)
    cluster.assert_all_kv_free()


def test_a_prompt_list_answers_each_prompt_as_alone(client, cluster):
    prompts = ["The quick brown fox", "Once upon a time"]
    response = client.completions.create(model="model0", prompt=prompts, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert [choice.text for choice in response.choices] == [grpc_greedy_text(cluster, p, 6) for p in prompts]
    cluster.assert_all_kv_free()


def test_tokenize_counts_what_a_completion_reports(client, cluster):
    root = openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.gateway.http_port}", api_key="unused", max_retries=0)
    tokenized = root.post("/tokenize", body={"model": "model0", "prompt": "Once upon a time"}, cast_to=object)
    usage = client.completions.create(model="model0", prompt="Once upon a time", max_tokens=1).usage
    assert tokenized["count"] == usage.prompt_tokens == len(tokenized["tokens"])
    detokenized = root.post("/detokenize", body={"model": "model0", "tokens": tokenized["tokens"]}, cast_to=object)
    assert "Once upon a time" in detokenized["prompt"]


def test_metrics_export_request_phases_and_waiting_requests(client, cluster):
    import urllib.request

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.gateway.http_port}/metrics", timeout=10) as response:
            return response.read().decode()

    client.completions.create(model="model0", prompt="phases", max_tokens=3)
    expected = [f'pdserve:{name}_count{{model_name="model0"}}' for name in (
        "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
        "request_prompt_tokens", "request_generation_tokens", "e2e_request_latency_seconds")]
    expected.append('pdserve:num_requests_waiting{model_name="model0"}')
    cluster.wait_until(lambda: all(series in scrape() for series in expected), f"{expected} in /metrics")
