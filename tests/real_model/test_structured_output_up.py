"""Structured outputs on the real model through `pdserve up` (a prefill and a decode replica):
every answer to fifty JSON schemas parses and validates, greedy and sampled, sent at once as
agents send them; the openai client's `beta.chat.completions.parse` fills a Pydantic model.
(A structured stream whose decode replica is killed: tests/real_model/test_decode_migration.py.)"""
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pydantic
import pytest

from pdserve.checkpoints.default_model import DEFAULT_MODEL_ID
from tests.real_model.schemas import fifty_schemas

pytestmark = pytest.mark.real_model

CONCURRENT_REQUESTS = 16
MAX_TOKENS = 400


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
