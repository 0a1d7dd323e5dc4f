"""`pdserve serve`: one colocated engine behind the OpenAI API, in its own process."""
import subprocess
import sys

import openai
import pytest

from pdserve.engine import LLM, SamplingParams
from pdserve.protocol.structured_output import StructuredOutput
from tests.helpers import ENGINE_FLAGS, ENGINE_OPTIONS, free_port, wait_for_health

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(e2e_model, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "pdserve", "serve", "--model", e2e_model, "--port", str(port),
                                *ENGINE_FLAGS], stdout=log, stderr=subprocess.STDOUT)
    wait_for_health(process, f"http://127.0.0.1:{port}/health", 120)
    yield port
    process.terminate()
    assert process.wait(timeout=20) == 0


def test_streamed_completion_equals_the_offline_engine(server, e2e_model):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="unused", max_retries=0, timeout=60)
    stream = client.completions.create(model="model0", prompt="colocated", max_tokens=16, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    text = "".join(choice.text for chunk in stream for choice in chunk.choices)
    expected = LLM(e2e_model, **ENGINE_OPTIONS).generate(
        ["colocated"], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)[0].outputs[0].text
    assert text == expected


def test_metrics_export_the_engines_phases_and_waiting_queue(server):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{server}/metrics", timeout=10) as response:
            families = text_string_to_metric_families(response.read().decode())
            return {sample.name + _labels(sample.labels): sample.value
                    for family in families for sample in family.samples}

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="unused", max_retries=0, timeout=60)
    before = scrape()
    response = client.completions.create(model="model0", prompt="the phases of two choices", max_tokens=3, n=2,
                                         extra_body={"ignore_eos": True})
    assert len(response.choices) == 2
    after = scrape()
    for name in ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds"):
        count = f'pdserve:{name}_count{{model_name="model0"}}'
        assert after[count] - before.get(count, 0.0) == 2, name  # one engine request per choice
    assert after['pdserve:num_requests_waiting{model_name="model0"}'] == 0
    # The engine's steps: each choice's prompt computed once (shorter than a block, so not cached),
    # then 2 decodes each (the first token comes from the prompt's step).
    grew = {key: value - before.get(key, 0.0) for key, value in after.items()}
    assert grew['pdserve:replica_computed_tokens{kind="engine",phase="prompt",replica=""}'] == \
        2 * response.usage.prompt_tokens
    assert grew['pdserve:replica_computed_tokens{kind="engine",phase="decode",replica=""}'] == 4
    assert grew['pdserve:replica_engine_steps{kind="engine",replica="",step="prompt"}'] >= 1
    assert grew['pdserve:replica_engine_step_seconds{kind="engine",replica="",step="decode"}'] > 0


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{name}="{value}"' for name, value in sorted(labels.items())) + "}" if labels else ""


def test_penalised_seeded_completion_equals_the_offline_engine(server, e2e_model):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="unused", max_retries=0, timeout=60)
    response = client.completions.create(
        model="model0", prompt="colocated", max_tokens=12, temperature=0.8, seed=5, logit_bias={"7": 2.5},
        presence_penalty=0.5, frequency_penalty=0.25,
        extra_body={"repetition_penalty": 1.25, "min_tokens": 4, "ignore_eos": True})
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=5, logit_bias={7: 2.5}, presence_penalty=0.5,
                            frequency_penalty=0.25, repetition_penalty=1.25, min_tokens=4, ignore_eos=True)
    expected = LLM(e2e_model, **ENGINE_OPTIONS).generate(
        ["colocated"], params, use_tqdm=False)[0].outputs[0].text
    assert response.choices[0].text == expected


def test_a_structured_completion_equals_the_offline_engine_and_a_bad_one_is_a_400(server, e2e_model):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="unused", max_retries=0, timeout=60)
    choices = ["alpha", "beta", "gamma"]
    response = client.completions.create(model="model0", prompt="pick one", max_tokens=8, temperature=0.7, seed=5,
                                         extra_body={"guided_choice": choices})
    expected = LLM(e2e_model, **ENGINE_OPTIONS).generate(["pick one"], SamplingParams(
        max_tokens=8, temperature=0.7, seed=5, structured_output=StructuredOutput(choice=tuple(choices))),
        use_tqdm=False)[0].outputs[0].text
    assert response.choices[0].text == expected and expected in choices
    with pytest.raises(openai.BadRequestError, match="does not compile"):
        client.completions.create(model="model0", prompt="x", max_tokens=4, extra_body={"guided_grammar": "start: ?"})
