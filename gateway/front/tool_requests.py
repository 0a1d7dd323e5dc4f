"""OpenAI's tool-calling request fields, checked: `tools`, `tool_choice` and `parallel_tool_calls`.

    tools                [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}]
    tool_choice          "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    parallel_tool_calls  a bool, default true

As vLLM reads them: tool_choice defaults to "auto" when tools are given; a tool_choice other than
"none" needs tools; with "none" the tools still reach the chat template, but nothing constrains
or parses the answer. A function without `parameters` takes none (its arguments are `{}`), as
OpenAI documents. Every field is checked, each function's schema by llguidance (which will hold
the arguments to it), and an error names the request field at fault.
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass

import llguidance

from pdserve.gateway.front.api_error import ApiError

TOOL_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})


class ToolChoice(enum.Enum):
    NONE = "none"  # the tools are shown to the model; its answer is text
    AUTO = "auto"  # text, or calls
    REQUIRED = "required"  # one or more calls
    NAMED = "named"  # exactly one call, of `function_name`


@dataclass(frozen=True, slots=True)
class FunctionTool:
    name: str
    parameters: str  # the JSON schema of its arguments, as JSON text


@dataclass(frozen=True, slots=True)
class ToolRequest:
    functions: tuple[FunctionTool, ...]  # in the request's order; names unique
    specs: tuple[dict, ...]  # the request's tool objects, as chat templates take them
    choice: ToolChoice
    function_name: str | None  # the one to call when choice is NAMED
    parallel: bool  # several calls may be made in one answer

    @property
    def calls_allowed(self) -> bool:
        """The answer may hold calls: it is constrained to them and parsed for them."""
        return self.choice is not ToolChoice.NONE


def parse_tool_request(body: dict) -> ToolRequest | None:
    """The request's tools, or None when it gives none."""
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, f"parallel_tool_calls={parallel!r}: must be a bool", param="parallel_tool_calls")
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise ApiError(400, f"tool_choice={choice!r} needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise ApiError(400, "tools must be a non-empty list of function tools", param="tools")
    functions = tuple(_function(tool, f"tools[{index}]") for index, tool in enumerate(tools))
    names = [function.name for function in functions]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ApiError(400, f"tools: the function name {duplicates[0]!r} is given twice", param="tools")
    choice, function_name = _choice(choice, names)
    return ToolRequest(functions, tuple(tools), choice, function_name, parallel is not False)


def _function(tool: object, where: str) -> FunctionTool:
    if not isinstance(tool, dict) or set(tool) != {"type", "function"} or tool["type"] != "function":
        raise ApiError(400, f'{where} must be {{"type": "function", "function": {{...}}}}', param="tools")
    function = tool["function"]
    if not isinstance(function, dict):
        raise ApiError(400, f"{where}.function must be an object", param="tools")
    unknown = sorted(set(function) - _FUNCTION_KEYS)
    if unknown:
        raise ApiError(400, f"{where}.function.{unknown[0]} is not supported", param="tools")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, f"{where}.function.name must be a non-empty string", param="tools")
    for key, kind, description in (("description", str, "a string"), ("parameters", dict, "a JSON schema object"),
                                   ("strict", bool, "a bool")):
        if function.get(key) is not None and not isinstance(function[key], kind):
            raise ApiError(400, f"{where}.function.{key} must be {description}", param="tools")
    parameters = json.dumps(_NO_PARAMETERS if function.get("parameters") is None else function["parameters"])
    try:
        error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_json_schema(parameters))
    except ValueError as exc:
        error = str(exc)
    if error:
        raise ApiError(400, f"{where}.function.parameters is not a JSON schema this server takes: {error}",
                       param="tools")
    return FunctionTool(name, parameters)


def _choice(choice: object, names: list[str]) -> tuple[ToolChoice, str | None]:
    if choice is None:
        return ToolChoice.AUTO, None
    if choice in ("none", "auto", "required"):
        return ToolChoice(choice), None
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, f'tool_choice={choice!r}: must be "none", "auto", "required" or '
                            '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    if name not in names:
        raise ApiError(400, f"tool_choice names the function {name!r}, which is not among the tools",
                       param="tool_choice")
    return ToolChoice.NAMED, name
