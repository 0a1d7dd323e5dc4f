"""Each --tool-call-parser reads back the calls it writes, leniently about whitespace, strictly about
the JSON, and only whole calls."""
import json
import re

import pytest

from pdserve.gateway.front.tool_parsers import TOOL_CALL_PARSERS, FunctionCall

WEATHER = ("get_weather", {"city": "Paris", "unit": "°C"})
NOOP = ("noop", {})


@pytest.mark.parametrize("name", sorted(TOOL_CALL_PARSERS))
def test_every_parser_reads_back_the_calls_it_writes(name):
    parser = TOOL_CALL_PARSERS[name]
    text = parser.write_calls([WEATHER, NOOP])

    calls, end = parser.parse_calls(text)

    assert calls == [FunctionCall("get_weather", '{"city": "Paris", "unit": "°C"}'), FunctionCall("noop", "{}")]
    assert text.startswith(parser.opener)
    assert parser.is_closing(text[end:])


@pytest.mark.parametrize(("name", "text"), [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("hermes", '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("llama3_json", '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("mistral", '[TOOL_CALLS][ {"name": "get_weather", "arguments": {"city": "Paris"}} ]'),
])
def test_the_layouts_as_models_write_them(name, text):
    calls, _ = TOOL_CALL_PARSERS[name].parse_calls(text)

    assert calls == [FunctionCall("get_weather", '{"city": "Paris"}')]


@pytest.mark.parametrize("name", sorted(TOOL_CALL_PARSERS))
def test_a_call_counts_only_once_complete(name):
    parser = TOOL_CALL_PARSERS[name]
    one = parser.write_calls([WEATHER])
    two = parser.write_calls([WEATHER, NOOP])
    first_call_end = len(one) - len(parser.list_close)

    for cut in range(first_call_end):
        assert parser.parse_calls(one[:cut]) == ([], 0), one[:cut]
    assert parser.parse_calls(two[:-len(parser.list_close) - 3]) == (parser.parse_calls(one)[0], first_call_end)


@pytest.mark.parametrize(("name", "text"), [
    ("hermes", '<tool_call>\n{"name": "get_weather"}\n</tool_call>'),  # no arguments
    ("hermes", '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": "{}"}\n</tool_call>'),  # arguments as text
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {}}\n</call>'),
    ("llama3_json", '["get_weather"]'),
    ("mistral", '[TOOL_CALLS]{"name": "f", "arguments": {}}'),  # not a list
])
def test_malformed_calls_are_not_calls(name, text):
    assert TOOL_CALL_PARSERS[name].parse_calls(text) == ([], 0)


def test_call_ids_are_openais_except_for_mistral_whose_templates_check_nine_characters():
    assert re.fullmatch("call_[0-9a-f]{24}", TOOL_CALL_PARSERS["hermes"].new_call_id())
    assert re.fullmatch("[A-Za-z0-9]{9}", TOOL_CALL_PARSERS["mistral"].new_call_id())
    assert TOOL_CALL_PARSERS["hermes"].new_call_id() != TOOL_CALL_PARSERS["hermes"].new_call_id()


def test_the_example_shows_the_layout_with_placeholders():
    assert TOOL_CALL_PARSERS["hermes"].call_example() == (
        '<tool_call>\n{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call>')
    assert TOOL_CALL_PARSERS["llama3_json"].call_example().startswith('{"name": <function-name>, "parameters"')
    assert json.loads(TOOL_CALL_PARSERS["mistral"].write_calls([NOOP])[len("[TOOL_CALLS]"):]) == [
        {"name": "noop", "arguments": {}}]
