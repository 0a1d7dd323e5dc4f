"""What a chat request's tools add to its prompt.

The tools go to the chat template (`apply_chat_template(..., tools=...)`). A template that ignores
them (it renders the same with and without them, as SmolLM2-135M-Instruct's does) would leave the
model unaware of its tools, so the prompt is then rendered from `fallback_messages` instead: a
system message (the conversation's own, with this text after its own) lists each tool's JSON and
shows the `--tool-call-parser`'s layout, and the calls of earlier assistant messages are written
into their content in that layout, since such a template shows content alone.

With tool_choice "none" there is no fallback: the model is not to call, so it is not told how.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pdserve.gateway.front.tool_parsers import ToolCallParser


@dataclass(frozen=True, slots=True)
class ToolPrompt:
    specs: tuple[dict, ...]  # the request's tool objects, for apply_chat_template(tools=...)
    parser: ToolCallParser | None  # the layout the fallback shows; None: no fallback

    def fallback_messages(self, messages: list[dict]) -> list[dict]:
        """`messages` for a template that ignores tools; raises ValueError without a parser."""
        if self.parser is None:
            raise ValueError("this prompt has no fallback")
        rewritten = [self._with_calls_as_text(message) for message in messages]
        if rewritten[0]["role"] == "system":
            first = rewritten[0]
            return [{**first, "content": first["content"] + "\n\n" + self._instructions()}, *rewritten[1:]]
        return [{"role": "system", "content": self._instructions()}, *rewritten]

    def _instructions(self) -> str:
        tools = "\n".join(json.dumps(spec, ensure_ascii=False) for spec in self.specs)
        return ("You may call one or more functions to answer. The functions, as JSON schemas within "
                f"<tools></tools> tags:\n<tools>\n{tools}\n</tools>\n\n"
                f"To call functions, answer in this form:\n{self.parser.call_example()}")

    def _with_calls_as_text(self, message: dict) -> dict:
        if "tool_calls" not in message:
            return message
        calls = self.parser.write_calls([(call["function"]["name"], call["function"]["arguments"])
                                         for call in message["tool_calls"]])
        content = message["content"] + "\n" + calls if message["content"] else calls
        return {key: value for key, value in message.items() if key != "tool_calls"} | {"content": content}
