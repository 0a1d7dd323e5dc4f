"""The Lark grammar (llguidance's dialect) that holds a chat answer to the tool calls its request
allows, written in the `--tool-call-parser`'s layout (tool_parsers).

    required   one or more calls (exactly one without parallel tool calls)
    named      exactly one call, of that function
    auto       free text that never opens a call, or the calls as for required; with a layout
               whose calls may follow text (hermes, mistral), text then the calls

Each call is one alternative per offered function, a JSON object {"name": <that name>,
<arguments key>: <its parameters schema>}, written as the engine writes JSON (", " and ": ", no
other whitespace). So the output is never a malformed call: anything that opens one is a call
to one of the tools, with arguments its schema accepts.

How "free text" is spelled: a terminal intersected with the negation of the opener, `/(?s:.*)/ &
~/(?s:.*)OPENER(?s:.*)/`, and the text before calls is a lazy lexeme that ends at the first
opener, so llguidance's lexer never has to split one greedy lexeme.

Grammars are cached by their inputs, all hashable, so a client that sends the same tools on every
turn builds the text once (and the compiler caches what it compiled from that text).
"""
from __future__ import annotations

import functools
import json

from pdserve.gateway.front.tool_parsers import ToolCallParser
from pdserve.gateway.front.tool_requests import FunctionTool, ToolChoice, ToolRequest
from pdserve.protocol.grammar_compiler import JSON_LAYOUT

CACHED_GRAMMARS = 256
_ANY = "(?s:.*)"
_REGEX_SPECIALS = frozenset("\\.+*?()|[]{}^$#&-~")  # the regex crate's meta characters
_SCHEMA_DEFINITIONS = ("$defs", "definitions")  # where "#/$defs/..." references point: the root


def tool_grammar(request: ToolRequest, parser: ToolCallParser) -> str:
    """The grammar of a request whose tool_choice is auto, required or a named function."""
    if request.choice is ToolChoice.NONE:
        raise ValueError("tool_choice none has no grammar")
    return _grammar(request.functions, request.choice, request.function_name, request.parallel, parser)


@functools.lru_cache(maxsize=CACHED_GRAMMARS)
def _grammar(functions: tuple[FunctionTool, ...], choice: ToolChoice, function_name: str | None,
             parallel: bool, parser: ToolCallParser) -> str:
    if choice is ToolChoice.NAMED:
        functions = tuple(function for function in functions if function.name == function_name)
        parallel = False
    more = f"({_literal(parser.separator)} call)*" if parallel else ""
    if choice is not ToolChoice.AUTO:
        start = ["start: calls"]
    elif not parser.after_text:
        start = ["start: TEXT | calls", f"TEXT: /{_ANY}/ & ~/{_regex(parser.opener)}{_ANY}/"]
    else:
        rest = (parser.list_open + parser.call_prefix)[len(parser.opener):]
        first_call = _sequence(_literal(rest), "body", _literal(parser.call_suffix))
        start = [f"start: TEXT | {_sequence('text_then_opener', first_call, more, _literal(parser.list_close))}",
                 f"TEXT: /{_ANY}/ & ~/{_ANY}{_regex(parser.opener)}{_ANY}/",
                 f"text_then_opener[lazy]: /{_ANY}/ {_literal(parser.opener)}"]
    return "\n".join([
        "%llguidance {}",
        *start,
        "calls: " + _sequence(_literal(parser.list_open), "call", more, _literal(parser.list_close)),
        "call: " + _sequence(_literal(parser.call_prefix), "body", _literal(parser.call_suffix)),
        "body: " + " | ".join(f"fn_{index}" for index in range(len(functions))),
        *(f"fn_{index}: %json {_call_schema(function, parser)}" for index, function in enumerate(functions)),
    ])


def _call_schema(function: FunctionTool, parser: ToolCallParser) -> str:
    arguments = json.loads(function.parameters)
    definitions = {key: arguments.pop(key) for key in _SCHEMA_DEFINITIONS if key in arguments}
    key = parser.arguments_keys[0]
    schema = {
        "type": "object",
        "properties": {"name": {"const": function.name}, key: arguments},
        "required": ["name", key],
        "additionalProperties": False,
        **definitions,
        "x-guidance": JSON_LAYOUT,
    }
    return json.dumps(schema)


def _sequence(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def _literal(text: str) -> str:
    """`text` as a Lark string literal; nothing for the empty string, which Lark does not take."""
    return json.dumps(text) if text else ""


def _regex(text: str) -> str:
    return "".join("\\" + char if char in _REGEX_SPECIALS else char for char in text)
