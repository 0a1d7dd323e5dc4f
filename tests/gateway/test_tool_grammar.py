"""The tool-call grammars, compiled by llguidance on the tiny model's tokenizer: they take the calls
each tool_choice allows, in the parser's layout, and refuse any malformed or unoffered call."""
import pytest

from pdserve.gateway.front.tool_calls import split_answer
from pdserve.gateway.front.tool_grammar import tool_grammar
from pdserve.gateway.front.tool_parsers import TOOL_CALL_PARSERS
from pdserve.gateway.front.tool_requests import parse_tool_request
from pdserve.protocol.grammar_compiler import GrammarCompiler
from pdserve.protocol.structured_output import StructuredOutput
from pdserve.protocol.tokenizer import load_tokenizer

WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
         {"type": "function", "function": {"name": "noop"}}]
PARIS = ("get_weather", {"city": "Paris"})
NOOP = ("noop", {})
PARSERS = sorted(TOOL_CALL_PARSERS)


@pytest.fixture(scope="module")
def compiler(tiny_model):
    return GrammarCompiler(load_tokenizer(tiny_model(num_layers=1)))


def grammar(parser_name: str, tools=TOOLS, **fields) -> str:
    request = parse_tool_request({"tools": tools, **fields})
    return tool_grammar(request, TOOL_CALL_PARSERS[parser_name])


def accepts(compiler: GrammarCompiler, grammar_text: str, output: str) -> bool:
    """Whether the grammar takes `output` whole, token by token, and may end there."""
    matcher = compiler.matcher(StructuredOutput(grammar=grammar_text))
    token_ids = compiler.tokenizer.tokenize_str(output)
    return matcher.validate_tokens(token_ids) == len(token_ids) and (
        matcher.consume_tokens(token_ids) and matcher.is_accepting())


def calls(parser_name: str, *functions) -> str:
    return TOOL_CALL_PARSERS[parser_name].write_calls(list(functions))


@pytest.mark.parametrize("parser", PARSERS)
def test_required_takes_one_or_more_calls_of_the_offered_functions_only(compiler, parser):
    required = grammar(parser, tool_choice="required")

    assert accepts(compiler, required, calls(parser, PARIS))
    assert accepts(compiler, required, calls(parser, PARIS, NOOP, PARIS))
    assert not accepts(compiler, required, "The weather is fine.")
    assert not accepts(compiler, required, calls(parser, ("get_time", {})))
    assert not accepts(compiler, required, calls(parser, ("get_weather", {"town": "Paris"})))  # schema
    assert not accepts(compiler, required, calls(parser, ("noop", {"x": 1})))  # no parameters: {}
    compact = calls(parser, PARIS).replace(", ", ",").replace(": ", ":")
    assert not accepts(compiler, required, compact)  # the engine's JSON layout only


@pytest.mark.parametrize("parser", PARSERS)
def test_without_parallel_calls_only_one_is_taken(compiler, parser):
    single = grammar(parser, tool_choice="required", parallel_tool_calls=False)

    assert accepts(compiler, single, calls(parser, PARIS))
    assert not accepts(compiler, single, calls(parser, PARIS, NOOP))


@pytest.mark.parametrize("parser", PARSERS)
def test_a_named_function_is_the_one_call(compiler, parser):
    named = grammar(parser, tool_choice={"type": "function", "function": {"name": "noop"}})

    assert accepts(compiler, named, calls(parser, NOOP))
    assert not accepts(compiler, named, calls(parser, PARIS))
    assert not accepts(compiler, named, calls(parser, NOOP, NOOP))


@pytest.mark.parametrize("parser", PARSERS)
def test_auto_takes_text_or_calls_never_a_malformed_call(compiler, parser):
    auto = grammar(parser)
    opener = TOOL_CALL_PARSERS[parser].opener

    assert accepts(compiler, auto, "The weather is fine.")
    assert accepts(compiler, auto, calls(parser, PARIS, NOOP))
    assert not accepts(compiler, auto, opener + " not a call")
    assert not accepts(compiler, auto, calls(parser, ("get_time", {})))


@pytest.mark.parametrize("parser", ["hermes", "mistral"])
def test_auto_text_may_lead_into_calls_where_the_parser_reads_them_after_text(compiler, parser):
    auto = grammar(parser)

    assert accepts(compiler, auto, "Let me check.\n" + calls(parser, PARIS))
    assert not accepts(compiler, auto, "Let me check. " + TOOL_CALL_PARSERS[parser].opener + " oops")


def test_llama3_json_auto_text_is_whatever_does_not_open_with_a_brace(compiler):
    auto = grammar("llama3_json")
    text = "Let me check.\n" + calls("llama3_json", ("get_time", {}))

    assert accepts(compiler, auto, text)
    assert split_answer(TOOL_CALL_PARSERS["llama3_json"], text) == (text, [])  # content, as the parser reads it


def test_a_schema_with_definitions_keeps_its_references(compiler):
    parameters = {"type": "object", "properties": {"place": {"$ref": "#/$defs/place"}}, "required": ["place"],
                  "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string"}},
                                      "required": ["city"], "additionalProperties": False}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": parameters}}]
    required = grammar("hermes", tools=tools, tool_choice="required")

    assert accepts(compiler, required, calls("hermes", ("get_weather", {"place": {"city": "Paris"}})))
    assert not accepts(compiler, required, calls("hermes", ("get_weather", {"place": {"town": "Paris"}})))


def test_the_same_tools_give_the_same_grammar_text_built_once():
    assert grammar("hermes", tool_choice="required") is grammar("hermes", tool_choice="required")
    assert grammar("hermes") != grammar("mistral")


def test_tool_choice_none_has_no_grammar():
    with pytest.raises(ValueError):
        grammar("hermes", tool_choice="none")
