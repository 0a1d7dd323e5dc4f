"""Splitting a streamed answer into content and tool calls: content flows until a call may begin,
each call comes out whole and once, nothing of the answer is lost, and a whole answer splits the
same way however it was cut into pieces."""
import pytest

from pdserve.gateway.front.tool_calls import ToolCallSplitter, split_answer, tool_finish_reason
from pdserve.gateway.front.tool_parsers import TOOL_CALL_PARSERS, FunctionCall

HERMES = TOOL_CALL_PARSERS["hermes"]
LLAMA = TOOL_CALL_PARSERS["llama3_json"]
CALLS = [("get_weather", {"city": "Paris"}), ("noop", {})]
FUNCTIONS = [FunctionCall("get_weather", '{"city": "Paris"}'), FunctionCall("noop", "{}")]


def stream(parser, pieces: list[str]) -> list[tuple[str, list]]:
    """(content, calls) per piece, the last entry being what finish() gave."""
    splitter = ToolCallSplitter(parser)
    return [splitter.feed(piece) for piece in pieces] + [splitter.finish()]


def characters(text: str) -> list[str]:
    return list(text)


def test_content_streams_until_the_opener_may_begin_and_calls_come_out_whole():
    text = "Let me look <that> up.\n" + HERMES.write_calls(CALLS)

    steps = stream(HERMES, characters(text))

    content = "".join(piece for piece, _ in steps)
    assert content == "Let me look <that> up.\n"
    first_call_at = next(i for i, (_, calls) in enumerate(steps) if calls)
    assert text[:first_call_at + 1].endswith("</tool_call>")
    calls = [call for _, new in steps for call in new]
    assert [call.function for call in calls] == FUNCTIONS
    assert [call.index for call in calls] == [0, 1]
    assert len({call.id for call in calls}) == 2
    assert [content for content, _ in steps[:3]] == ["L", "e", "t"]  # plain text is not held


def test_a_possible_opener_is_held_until_the_text_tells():
    steps = stream(HERMES, ["a <tool", "_c", "at> b", ""])

    assert [content for content, _ in steps] == ["a ", "", "<tool_cat> b", "", ""]


def test_a_call_cut_short_ends_as_content():
    cut = HERMES.write_calls(CALLS)[:-5]

    content, calls = split_answer(HERMES, "Sure. " + cut)

    assert [call.function for call in calls] == FUNCTIONS[:1]
    assert content == "Sure. " + cut[cut.index("\n<tool_call>", 1):]


def test_text_alone_is_all_content():
    assert split_answer(HERMES, "no tools <tool needed") == ("no tools <tool needed", [])
    assert split_answer(LLAMA, "") == ("", [])


def test_llama3_json_calls_only_open_the_answer():
    call = LLAMA.write_calls(CALLS[:1])

    assert [c.function for c in split_answer(LLAMA, call)[1]] == FUNCTIONS[:1]
    assert split_answer(LLAMA, "x " + call) == ("x " + call, [])
    steps = stream(LLAMA, ["Sure", " {", "}"])
    assert [content for content, _ in steps] == ["Sure", " {", "}", ""]


@pytest.mark.parametrize("name", sorted(TOOL_CALL_PARSERS))
@pytest.mark.parametrize("piece_chars", [1, 3, 1000])
def test_streamed_and_whole_answers_agree(name, piece_chars):
    parser = TOOL_CALL_PARSERS[name]
    text = ("" if name == "llama3_json" else "Checking.\n") + parser.write_calls(CALLS)

    steps = stream(parser, [text[i:i + piece_chars] for i in range(0, len(text), piece_chars)])

    whole_content, whole_calls = split_answer(parser, text)
    assert "".join(content for content, _ in steps) == whole_content
    assert [call.function for _, calls in steps for call in calls] == [call.function for call in whole_calls]
    assert [call.function for call in whole_calls] == FUNCTIONS


def test_a_call_as_openai_shapes_it():
    [call] = split_answer(HERMES, HERMES.write_calls(CALLS[:1]))[1]

    assert call.as_json() == {"id": call.id, "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert call.as_delta() == {"index": 0, **call.as_json()}


def test_an_answer_that_stopped_after_calls_finishes_with_tool_calls():
    assert tool_finish_reason("stop", 1) == "tool_calls"
    assert tool_finish_reason("stop", 0) == "stop"
    assert tool_finish_reason("length", 2) == "length"
    assert tool_finish_reason(None, 2) is None
