"""Structured outputs on the real model through `pdserve up` (a prefill and a decode replica):
every answer to fifty JSON schemas parses and validates, greedy and sampled, sent at once as
agents send them; the openai client's `beta.chat.completions.parse` fills a Pydantic model; with
five tools offered, `tool_choice="required"` gives valid calls to fifty requests and "auto" text
or valid calls, never a malformed one.
(A structured stream whose decode replica is killed: tests/real_model/test_decode_migration.py.)"""
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pydantic
import pytest

from pdserve.checkpoints.default_model import DEFAULT_MODEL_ID
from tests.real_model.schemas import fifty_schemas
from tests.real_model.tools import REQUESTS, TOOLS

pytestmark = pytest.mark.real_model

CONCURRENT_REQUESTS = 16
MAX_TOKENS = 400
REQUIRED_MAX_TOKENS = 400  # more than the longest call the schemas allow (about 380 characters)
AUTO_MAX_TOKENS = 256  # a text answer may be cut, and a call with it


class Capital(pydantic.BaseModel):
    country: str = pydantic.Field(max_length=40)
    capital: str = pydantic.Field(max_length=40)
    population_millions: int = pydantic.Field(ge=0, le=2000)


def answer(client, subject: str, schema: dict, temperature: float, seed: int):
    return client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": f"Describe a {subject} as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": subject, "schema": schema, "strict": True}},
        max_tokens=MAX_TOKENS, temperature=temperature, seed=seed).choices[0]


def test_every_answer_to_fifty_schemas_validates_greedy_and_sampled(openai_client):
    cases = [(subject, schema, temperature, seed) for seed, (subject, schema) in enumerate(fifty_schemas())
             for temperature in (0.0, 0.8)]
    with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        choices = list(pool.map(lambda case: answer(openai_client, *case), cases))

    for (subject, schema, temperature, _), choice in zip(cases, choices):
        where = f"{subject} at temperature {temperature}: {choice.message.content!r}"
        assert choice.finish_reason == "stop", where
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_the_openai_clients_parse_fills_a_pydantic_model(openai_client):
    completion = openai_client.beta.chat.completions.parse(
        model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": "What is the capital of France?"}],
        response_format=Capital, max_tokens=MAX_TOKENS, temperature=0)
    capital = completion.choices[0].message.parsed
    assert isinstance(capital, Capital)
    assert capital.capital == "Paris"


def call_tools(client, request: str, tool_choice: str, max_tokens: int):
    """One call at most: offered parallel calls, SmolLM2-135M tends to repeat its call until
    max_tokens (each call valid, the cut one returned as content)."""
    return client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": request}], tools=TOOLS,
        tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=max_tokens, temperature=0).choices[0]


def assert_valid_calls(choice, finished: bool = True) -> None:
    """Every call names an offered function and its arguments validate against its parameters."""
    parameters = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    assert choice.finish_reason == "tool_calls" or not finished, choice
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), parameters[call.function.name])


def test_required_tool_choice_gives_valid_calls_for_all_fifty_requests(openai_client):
    with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        choices = list(pool.map(
            lambda request: call_tools(openai_client, request, "required", REQUIRED_MAX_TOKENS), REQUESTS))

    for choice in choices:
        assert len(choice.message.tool_calls) == 1, choice
        assert_valid_calls(choice)


def test_auto_tool_choice_gives_text_or_valid_calls_never_a_malformed_one(openai_client):
    with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
        choices = list(pool.map(lambda request: call_tools(openai_client, request, "auto", AUTO_MAX_TOKENS), REQUESTS))

    for choice in choices:
        if choice.finish_reason == "length":  # cut: whatever calls it completed are valid
            assert_valid_calls(choice, finished=False)
        elif choice.message.tool_calls:
            assert_valid_calls(choice)
        else:  # text that never opens a call
            assert choice.finish_reason == "stop" and "<tool_call>" not in choice.message.content
    print(f"auto: {sum(bool(choice.message.tool_calls) for choice in choices)} of {len(choices)} answers call tools")
