"""One chat choice's answer split into content and tool calls as its text streams in.

    text ──▶ content, reported as it comes, except a tail that may be the start of the opener
         └─▶ from the opener on: the calls, held back; each reported whole once complete

Where calls may begin is the parser's (gateway.front.tool_parsers): after any text, or only at the
start of the answer. A call is reported once, with a fresh id and its index in the answer. At
the end, the calls' text that is left over beyond the layout's end (a call cut short by
max_tokens or a stop string) becomes content, so no text of the answer is lost. A whole answer
goes through the same splitter (`split_answer`), so streamed and whole answers agree.
"""
from __future__ import annotations

from dataclasses import dataclass

from pdserve.gateway.front.tool_parsers import FunctionCall, ToolCallParser


@dataclass(frozen=True, slots=True)
class ToolCall:
    index: int  # its place among the answer's calls
    id: str
    function: FunctionCall

    def as_json(self) -> dict:
        """An entry of a message's `tool_calls`."""
        function = {"name": self.function.name, "arguments": self.function.arguments}
        return {"id": self.id, "type": "function", "function": function}

    def as_delta(self) -> dict:
        """An entry of a streamed delta's `tool_calls`: the whole call, at its first and only appearance."""
        return {"index": self.index, **self.as_json()}


class ToolCallSplitter:
    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self._held = ""  # text not yet reported: a possible opener's start, or the calls so far
        self._in_calls = False
        self._reported_text = False  # some content was reported (the answer does not open with calls)
        self._calls: list[ToolCall] = []
        self._calls_end = 0  # offset in _held past the last complete call

    @property
    def num_calls(self) -> int:
        return len(self._calls)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """The content and the calls that `text`, the answer's next piece, completes."""
        self._held += text
        content = "" if self._in_calls else self._take_content()
        return content, self._take_calls() if self._in_calls else []

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left once the answer has ended: held text as content, and the last calls."""
        if not self._in_calls:
            content, self._held = self._held, ""
            return content, []
        calls = self._take_calls()
        left_over = self._held[self._calls_end:]
        return ("" if self._parser.is_closing(left_over) else left_over), calls

    def _take_content(self) -> str:
        opener = self._parser.opener
        if not self._parser.after_text:
            if self._reported_text or not (self._held.startswith(opener) or opener.startswith(self._held)):
                content, self._held = self._held, ""
                self._reported_text = self._reported_text or bool(content)
                return content
            self._in_calls = self._held.startswith(opener)
            return ""
        start = self._held.find(opener)
        if start < 0:
            start = len(self._held) - _opener_start_length(self._held, opener)
        else:
            self._in_calls = True
        content, self._held = self._held[:start], self._held[start:]
        return content

    def _take_calls(self) -> list[ToolCall]:
        functions, self._calls_end = self._parser.parse_calls(self._held)
        new = [ToolCall(index, self._parser.new_call_id(), function)
               for index, function in enumerate(functions) if index >= len(self._calls)]
        self._calls.extend(new)
        return new


def split_answer(parser: ToolCallParser, text: str) -> tuple[str, list[ToolCall]]:
    """A whole answer's content and calls."""
    splitter = ToolCallSplitter(parser)
    content, calls = splitter.feed(text)
    more_content, more_calls = splitter.finish()
    return content + more_content, calls + more_calls


def tool_finish_reason(finish_reason: str | None, num_calls: int) -> str | None:
    """OpenAI's "tool_calls" for an answer that ended by itself after making calls."""
    return "tool_calls" if finish_reason == "stop" and num_calls else finish_reason


def _opener_start_length(text: str, opener: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of `opener`."""
    for length in range(min(len(text), len(opener) - 1), 0, -1):
        if opener.startswith(text[-length:]):
            return length
    return 0
