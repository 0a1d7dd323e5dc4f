"""Structured outputs through a gateway, a prefill and a decode replica, as real processes: the
prefill replica samples the first token under the constraint and the decode replica replays it
before going on, so the text equals an in-process engine's, greedy and sampled, streamed or
not. The official openai client's `response_format`, `beta.chat.completions.parse` with a
Pydantic model and vLLM's `guided_*` work unchanged, gRPC carries the same constraint, and a
constraint that does not compile is refused (HTTP 400 with a JSON body, gRPC INVALID_ARGUMENT)
before any KV is reserved."""
import asyncio
import json

import grpc
import jsonschema
import openai
import pydantic
import pytest

from pdserve.engine import LLM, SamplingParams
from pdserve.protocol.structured_output import StructuredOutput
from pdserve.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.helpers import ENGINE_OPTIONS

pytestmark = pytest.mark.e2e

ORDER = {
    "type": "object",
    "properties": {
        "item": {"type": "string", "maxLength": 10},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "size": {"enum": ["small", "medium", "large"]},
    },
    "required": ["item", "quantity", "size"],
    "additionalProperties": False,
}
PROMPT = "An order, as JSON:"


class Order(pydantic.BaseModel):
    item: str = pydantic.Field(max_length=10)  # bounded: a random model need not end a string or a number
    quantity: int = pydantic.Field(ge=1, le=99)
    express: bool


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster([("decode", "d0", ()), ("prefill", "p0", ()),
                         ("gateway", "gw", ("--prefill-placement", "remote"))])


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.gateway.http_port}/v1", api_key="unused",
                         timeout=60, max_retries=0)


@pytest.fixture(scope="module")
def engine_texts(e2e_model):
    """The in-process engine's texts for PROMPT under ORDER: greedy, then seeded sampling."""
    engine = LLM(e2e_model, **ENGINE_OPTIONS)
    outputs = engine.generate([PROMPT] * 2, [
        SamplingParams(max_tokens=80, temperature=temperature, seed=7, structured_output=StructuredOutput(json=ORDER))
        for temperature in (0.0, 0.9)], use_tqdm=False)
    return [output.outputs[0].text for output in outputs]


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "order", "schema": schema, "strict": True}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("sampled", [False, True])
def test_a_json_schema_gives_the_engines_text_and_it_validates(client, cluster, engine_texts, stream, sampled):
    response = client.completions.create(
        model="model0", prompt=PROMPT, max_tokens=80, temperature=0.9 if sampled else 0.0, seed=7, stream=stream,
        extra_body={"response_format": response_format(ORDER)})
    chunks = list(response) if stream else [response]
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)

    assert text == engine_texts[sampled]
    jsonschema.validate(json.loads(text), ORDER)
    assert chunks[-1].choices[0].finish_reason == "stop"
    cluster.assert_all_kv_free()


def test_the_openai_clients_parse_fills_a_pydantic_model(client):
    completion = client.beta.chat.completions.parse(
        model="model0", messages=[{"role": "user", "content": "Order something."}], response_format=Order,
        max_tokens=80, temperature=0)
    order = completion.choices[0].message.parsed
    assert isinstance(order, Order)
    assert completion.choices[0].message.content == order.model_dump_json().replace('":', '": ').replace(',"', ', "')


@pytest.mark.parametrize(("extra_body", "holds"), [
    ({"guided_choice": ["red", "green", "blue"]}, lambda text: text in ("red", "green", "blue")),
    ({"guided_regex": r"[A-Z]{3}-\d{4}"}, lambda text: len(text) == 8 and text[3] == "-" and text[4:].isdigit()),
    ({"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}}, lambda text: text in ("yes", "no")),
], ids=["guided_choice", "guided_regex", "gbnf"])
def test_vllms_fields_constrain_a_chat_answer(client, extra_body, holds):
    response = client.chat.completions.create(
        model="model0", messages=[{"role": "user", "content": "Answer."}], max_tokens=200, temperature=1.0, seed=3,
        extra_body=extra_body)
    text = response.choices[0].message.content
    assert holds(text), text
    assert response.choices[0].finish_reason == "stop"


def test_a_constraint_that_does_not_compile_is_a_400_and_reserves_nothing(client, cluster):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="model0", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=5, extra_body={"guided_regex": "[a-"})
    assert "does not compile" in raised.value.body["message"]
    cluster.assert_all_kv_free()


def test_grpc_carries_the_constraint_and_refuses_one_that_does_not_compile(cluster, engine_texts):
    async def generate(constraint: common_pb2.StructuredOutput) -> str:
        async with grpc.aio.insecure_channel(cluster.gateway.endpoint) as channel:
            request = gateway_pb2.GenerateRequest(prompt=PROMPT, params=common_pb2.SamplingParams(
                max_tokens=80, temperature=0, structured_output=constraint))
            stub = gateway_pb2_grpc.GatewayStub(channel)
            return "".join([chunk.text async for chunk in stub.Generate(request, timeout=60)])

    assert asyncio.run(generate(common_pb2.StructuredOutput(json_schema=json.dumps(ORDER)))) == engine_texts[0]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        asyncio.run(generate(common_pb2.StructuredOutput(grammar="start: missing")))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "missing" in raised.value.details()
    cluster.assert_all_kv_free()
