"""Every spelling of a structured output on the OpenAI front becomes the same `StructuredOutput`:
OpenAI's `response_format`, vLLM's `structured_outputs` object and its `guided_*` fields, on both
endpoints; `response_format` of type text means none."""
import pytest

from pdserve.gateway.front.openai_protocol import parse_chat_request, parse_completion_request
from pdserve.protocol.structured_output import StructuredOutput

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("fields", "expected"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     StructuredOutput(json=SCHEMA)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, StructuredOutput(json_object=True)),
    ({"response_format": {"type": "json_object"}}, StructuredOutput(json_object=True)),
    ({"response_format": {"type": "text"}}, None),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredOutput(json=SCHEMA)),
    ({"structured_outputs": {"regex": "a+", "json": None}}, StructuredOutput(regex="a+")),
    ({"structured_outputs": {"json_object": True}}, StructuredOutput(json_object=True)),
    ({"guided_json": SCHEMA}, StructuredOutput(json=SCHEMA)),
    ({"guided_json": '{"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}'},
     StructuredOutput(json=SCHEMA)),
    ({"guided_regex": r"\d+"}, StructuredOutput(regex=r"\d+")),
    ({"guided_choice": ["x", "y"]}, StructuredOutput(choice=("x", "y"))),
    ({"guided_grammar": 'root ::= "a"'}, StructuredOutput(grammar='root ::= "a"')),
    ({}, None),
], ids=lambda value: next(iter(value), "none") if isinstance(value, dict) else None)
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_each_spelling_reaches_the_sampling_params(fields, expected, endpoint):
    if endpoint == "chat":
        parsed = parse_chat_request({"messages": CHAT} | fields, "m", max_model_len=64)
    else:
        parsed = parse_completion_request({"prompt": "hi"} | fields, "m")
    assert parsed.generate_input.params.structured_output == expected


def test_a_schema_keeps_its_property_order():
    """The order a schema lists properties in is the order they are generated in."""
    parsed = parse_completion_request({"prompt": "hi", "guided_json": SCHEMA}, "m")
    assert parsed.generate_input.params.structured_output.json == (
        '{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}')
