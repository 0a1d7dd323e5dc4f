"""OpenAI's chat messages, checked and put in the shape Hugging Face chat templates take.

    {"role", "content"}           content: a string, or a list of text parts (joined by newlines)
      + "name"                    kept, for templates that show it
    assistant + "tool_calls"      [{"id", "type": "function", "function": {"name", "arguments"}}],
                                  arguments as JSON text; content may then be null
    tool + "tool_call_id"         the result of that call

What templates get: each call's arguments as a dict (transformers' documented shape, as vLLM
hands them over), a null content as "", and on a tool message the name of the function it
answers when an earlier message holds that call. Anything else is refused with a 400 that names
the message.
"""
from __future__ import annotations

import json

from pdserve.gateway.front.api_error import ApiError

_KEYS = frozenset({"role", "content", "name"})
_KEYS_OF_ROLE = {"assistant": _KEYS | {"tool_calls"}, "tool": _KEYS | {"tool_call_id"}}


def parse_messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    parsed: list[dict] = []
    call_names: dict[str, str] = {}  # tool call id -> its function's name
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _error(f"{where} must be an object")
        role = message.get("role")
        unknown = sorted(set(message) - (_KEYS_OF_ROLE.get(role, _KEYS) if isinstance(role, str) else _KEYS))
        if unknown:
            raise _error(f"{where}.{unknown[0]} is not supported for role {role!r}")
        entry = {"role": role}
        if message.get("tool_calls") is not None:
            entry["tool_calls"] = [_tool_call(call, f"{where}.tool_calls[{i}]")
                                   for i, call in enumerate(_non_empty_list(message["tool_calls"], where))]
            call_names.update((call["id"], call["function"]["name"]) for call in entry["tool_calls"])
        content = message.get("content")
        entry["content"] = "" if content is None and "tool_calls" in entry else _text(content, where)
        if message.get("name") is not None:
            entry["name"] = _string(message["name"], f"{where}.name")
        if entry["role"] == "tool":
            entry["tool_call_id"] = _string(message.get("tool_call_id"), f"{where}.tool_call_id")
            if "name" not in entry and entry["tool_call_id"] in call_names:
                entry["name"] = call_names[entry["tool_call_id"]]
        parsed.append(entry)
    return parsed


def _tool_call(call: object, where: str) -> dict:
    if not isinstance(call, dict) or call.get("type") != "function" or not isinstance(call.get("function"), dict):
        raise _error(f'{where} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
    function = call["function"]
    arguments_text = _string(function.get("arguments"), f"{where}.function.arguments")
    try:
        arguments = json.loads(arguments_text)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise _error(f"{where}.function.arguments must be a JSON object, as text")
    return {"id": _string(call.get("id"), f"{where}.id"), "type": "function",
            "function": {"name": _string(function.get("name"), f"{where}.function.name"), "arguments": arguments}}


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _error(f"{where}.content: only text parts are supported")
            texts.append(part["text"])
        return "\n".join(texts)
    raise _error(f"{where}.content must be a string or a list of text parts")


def _non_empty_list(value: object, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise _error(f"{where}.tool_calls must be a non-empty list")
    return value


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _error(f"{where} must be a string")
    return value


def _error(message: str) -> ApiError:
    return ApiError(400, message, param="messages")
