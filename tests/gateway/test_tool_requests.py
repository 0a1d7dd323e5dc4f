"""Chat requests with tools: what reaches the prompt, the constraint and the answer's parser, and
what is refused with a 400 naming the field."""
import json

import pytest

from pdserve.gateway.front.api_error import ApiError
from pdserve.gateway.front.openai_protocol import parse_chat_request
from pdserve.gateway.front.tool_parsers import TOOL_CALL_PARSERS
from pdserve.gateway.front.tool_requests import FunctionTool, ToolChoice, parse_tool_request

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
NOOP = {"type": "function", "function": {"name": "noop"}}
MISTRAL = TOOL_CALL_PARSERS["mistral"]


def chat(**body):
    return parse_chat_request({"messages": USER, **body}, "m", 1024, MISTRAL)


def refusal(**body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat(**body)
    assert caught.value.status == 400
    return caught.value


def test_tools_default_to_auto_constrained_and_parsed_in_the_servers_layout():
    parsed = chat(tools=[WEATHER, NOOP])

    generate_input = parsed.generate_input
    assert parsed.tool_parser is MISTRAL
    assert generate_input.tool_prompt.specs == (WEATHER, NOOP)
    assert generate_input.tool_prompt.parser is MISTRAL
    grammar = generate_input.params.structured_output.grammar
    assert "[TOOL_CALLS]" in grammar and '"const": "get_weather"' in grammar and '"const": "noop"' in grammar


def test_tool_choice_none_shows_the_tools_to_the_template_only():
    parsed = chat(tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"})

    assert parsed.tool_parser is None
    assert parsed.generate_input.tool_prompt.specs == (WEATHER,)
    assert parsed.generate_input.tool_prompt.parser is None  # no fallback instructions to call
    assert parsed.generate_input.params.structured_output.kind == "json_object"


def test_no_tools_change_nothing():
    parsed = chat(tool_choice="none", parallel_tool_calls=False)

    assert parsed.tool_parser is None and parsed.generate_input.tool_prompt is None
    assert parsed.generate_input.params.structured_output is None


def test_the_request_maps_onto_a_tool_request():
    request = parse_tool_request({"tools": [WEATHER, NOOP], "tool_choice": {"type": "function", "function": {
        "name": "noop"}}, "parallel_tool_calls": False})

    assert request.functions == (FunctionTool("get_weather", json.dumps(WEATHER["function"]["parameters"])),
                                 FunctionTool("noop", '{"type": "object", "properties": {}, '
                                                      '"additionalProperties": false}'))
    assert (request.choice, request.function_name, request.parallel) == (ToolChoice.NAMED, "noop", False)
    assert parse_tool_request({"tools": [NOOP], "tool_choice": "required"}).choice is ToolChoice.REQUIRED
    assert parse_tool_request({"tools": [NOOP]}).parallel is True


@pytest.mark.parametrize(("body", "param", "fragment"), [
    ({"tools": []}, "tools", "non-empty list"),
    ({"tools": {"type": "function"}}, "tools", "non-empty list"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [NOOP, {"type": "function", "function": {"name": ""}}]}, "tools", "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools",
     "tools[0].function.parameters must be a JSON schema object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "returns": {}}}]}, "tools",
     "tools[0].function.returns is not supported"),
    ({"tools": [NOOP, NOOP]}, "tools", "'noop' is given twice"),
    ({"tools": [NOOP, {"type": "function", "function": {"name": "f", "parameters": {"type": "text"}}}]}, "tools",
     "tools[1].function.parameters is not a JSON schema this server takes: Invalid type: text"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/$defs/gone"}}}]}, "tools",
     "tools[0].function.parameters is not a JSON schema"),
    ({"tool_choice": "auto"}, "tool_choice", "needs tools"),
    ({"tools": [NOOP], "tool_choice": "any"}, "tool_choice", '"none", "auto", "required"'),
    ({"tools": [NOOP], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice",
     "'get_weather', which is not among the tools"),
    ({"tools": [NOOP], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "must be a bool"),
    ({"tools": [NOOP], "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined with tools"),
    ({"tools": [NOOP], "tool_choice": "required", "structured_outputs": {"regex": "a"}}, "structured_outputs",
     "(here required)"),
])
def test_bad_tool_fields_are_400s_naming_the_field(body, param, fragment):
    error = refusal(**body)

    assert error.param == param
    assert fragment in error.message


def test_a_text_response_format_goes_with_tools():
    assert chat(tools=[NOOP], response_format={"type": "text"}).tool_parser is MISTRAL


def test_an_agent_loops_second_turn_reaches_the_template_in_its_shape():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "22 C"}]}]

    parsed = parse_chat_request({"messages": messages, "tools": [WEATHER]}, "m", 1024)

    assert parsed.generate_input.messages == [
        *USER,
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "22 C", "tool_call_id": "call_1", "name": "get_weather"},
    ]
