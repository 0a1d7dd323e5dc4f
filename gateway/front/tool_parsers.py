"""How a model writes its tool calls, one layout per `--tool-call-parser`. The same layout is read
back from the output (`parse_calls`), written into the constraint (tool_grammar) and shown to a
model whose chat template ignores tools (tool_prompt).

    hermes       <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   calls joined by "\\n"
    llama3_json  {"name": "f", "parameters": {...}}                             calls joined by "; "
    mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]

A layout is `list_open`, then the calls joined by `separator`, each `call_prefix` + a JSON object +
`call_suffix`, then `list_close`. The calls begin at `opener`: hermes and mistral calls may follow
free text (which is the message's content), llama3_json calls only open the output, as vLLM's
parsers of these names read them.

Reading is lenient about whitespace around the layout's punctuation and strict about the JSON:
a call is an object {"name": string, <arguments key>: object}.
"""
from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass

_DECODER = json.JSONDecoder()
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True, slots=True)
class FunctionCall:
    name: str
    arguments: str  # a JSON object, as text: OpenAI's `function.arguments`


@dataclass(frozen=True, slots=True)
class ToolCallParser:
    name: str
    opener: str  # the text that starts the calls; a prefix of list_open + call_prefix
    after_text: bool  # calls may follow free text; else they only open the output
    list_open: str
    call_prefix: str
    call_suffix: str
    separator: str
    list_close: str
    arguments_keys: tuple[str, ...]  # the key of a call's arguments (the first is the one written)
    call_id_chars: int  # 0: ids "call_<24 hex>"; else this many letters and digits (mistral's templates check it)

    def parse_calls(self, text: str) -> tuple[list[FunctionCall], int]:
        """The complete calls at the start of `text`, which starts with `opener`, and the offset
        where the last of them ends (0 if none is complete yet or the layout is broken)."""
        calls: list[FunctionCall] = []
        end = 0
        offset = _after(text, 0, self.list_open)
        while offset is not None and (found := self._next_call(text, offset, first=not calls)) is not None:
            call, end = found
            calls.append(call)
            offset = end
        return calls, end

    def is_closing(self, text: str) -> bool:
        """True when `text`, after the last call, is only the end of the layout."""
        return not text.strip() or text.strip() == self.list_close.strip()

    def write_calls(self, calls: list[tuple[str, dict]]) -> str:
        """(name, arguments) calls in this layout, as the constrained model writes them."""
        return self._layout([json.dumps({"name": name, self.arguments_keys[0]: arguments}, ensure_ascii=False)
                             for name, arguments in calls])

    def call_example(self) -> str:
        """One call written with placeholders, for a prompt that shows the layout."""
        return self._layout([f'{{"name": <function-name>, "{self.arguments_keys[0]}": <arguments-json-object>}}'])

    def new_call_id(self) -> str:
        if self.call_id_chars:
            return "".join(secrets.choice(_ID_ALPHABET) for _ in range(self.call_id_chars))
        return "call_" + secrets.token_hex(12)

    def _layout(self, call_objects: list[str]) -> str:
        calls = self.separator.join(self.call_prefix + text + self.call_suffix for text in call_objects)
        return self.list_open + calls + self.list_close

    def _next_call(self, text: str, offset: int, first: bool) -> tuple[FunctionCall, int] | None:
        """The complete call at `offset` (behind its separator unless it is the first) and the
        offset past it, or None."""
        if not first:
            offset = _after(text, offset, self.separator)
        offset = None if offset is None else _after(text, offset, self.call_prefix)
        if offset is None:
            return None
        try:
            value, offset = _DECODER.raw_decode(text, _skip_space(text, offset))
        except json.JSONDecodeError:
            return None
        call, offset = self._call(value), _after(text, offset, self.call_suffix)
        return None if call is None or offset is None else (call, offset)

    def _call(self, value: object) -> FunctionCall | None:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = next((value[key] for key in self.arguments_keys if key in value), None)
        if not isinstance(arguments, dict):
            return None
        return FunctionCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _skip_space(text: str, offset: int) -> int:
    while offset < len(text) and text[offset].isspace():
        offset += 1
    return offset


def _after(text: str, offset: int, literal: str) -> int | None:
    """The offset past `literal` (its surrounding whitespace free) at `offset`, or None."""
    literal = literal.strip()
    offset = _skip_space(text, offset) if literal else offset
    return offset + len(literal) if text.startswith(literal, offset) else None


TOOL_CALL_PARSERS = {
    parser.name: parser for parser in (
        ToolCallParser("hermes", opener="<tool_call>", after_text=True, list_open="",
                       call_prefix="<tool_call>\n", call_suffix="\n</tool_call>", separator="\n", list_close="",
                       arguments_keys=("arguments",), call_id_chars=0),
        ToolCallParser("llama3_json", opener="{", after_text=False, list_open="", call_prefix="", call_suffix="",
                       separator="; ", list_close="", arguments_keys=("parameters", "arguments"), call_id_chars=0),
        ToolCallParser("mistral", opener="[TOOL_CALLS]", after_text=True, list_open="[TOOL_CALLS][",
                       call_prefix="", call_suffix="", separator=", ", list_close="]",
                       arguments_keys=("arguments",), call_id_chars=9),
    )
}
DEFAULT_TOOL_CALL_PARSER = "hermes"
