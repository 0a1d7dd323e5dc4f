"""Answers to chat requests with tools: calls read out of the text into `tool_calls`, content the
text outside them, "tool_calls" as the finish reason; streamed, content flows while no call can
have begun and each call arrives whole. The openai client assembles both."""
import json

from pdserve.gateway.front.frontend_types import StreamChunk
from pdserve.gateway.front.openai_protocol import parse_chat_request
from pdserve.gateway.front.openai_shaping import create_shaper

MODEL = "fake-model"
USER = [{"role": "user", "content": "Weather in Paris and Rome?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
PARIS_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ROME_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
SCRIPT = ["Let me", " check.", "\n<tool", "_call>\n{\"name\": ", '"get_weather", "arguments": {"city": "Paris"}}',
          "\n</tool_call>", "\n" + ROME_CALL]


def chat(**body):
    return parse_chat_request({"messages": USER, **body}, MODEL, 1024)


def chunks(texts: list[str], finish_reason: str = "stop") -> list[StreamChunk]:
    return [StreamChunk(request_id="r", token_ids=[i], text=text, logprobs=[],
                        finish_reason=finish_reason if i == len(texts) - 1 else None, stop_reason=None,
                        prompt_tokens=3, completion_tokens=i + 1) for i, text in enumerate(texts)]


def shaper_for(parsed):
    return create_shaper(parsed, "r1", MODEL, 0, lambda token_ids: "")


def whole_choice(parsed, texts: list[str], finish_reason: str = "stop") -> dict:
    return shaper_for(parsed).response([chunks(texts, finish_reason)])["choices"][0]


def streamed_choices(parsed, texts: list[str]) -> list[dict]:
    shaper = shaper_for(parsed)
    return [event["choices"][0] for chunk in chunks(texts) for event in shaper.chunk_events(0, chunk)]


def test_a_whole_answer_carries_its_calls_and_the_text_before_them():
    choice = whole_choice(chat(tools=[WEATHER]), SCRIPT)

    message = choice["message"]
    assert message["content"] == "Let me check.\n"
    assert [call["function"] for call in message["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"name": "get_weather", "arguments": '{"city": "Rome"}'}]
    assert all(call["type"] == "function" and call["id"].startswith("call_") for call in message["tool_calls"])
    assert choice["finish_reason"] == "tool_calls"


def test_an_answer_of_calls_alone_has_null_content():
    message = whole_choice(chat(tools=[WEATHER], tool_choice="required"), [PARIS_CALL])["message"]

    assert message["content"] is None and len(message["tool_calls"]) == 1


def test_an_answer_without_calls_is_text_with_no_calls():
    choice = whole_choice(chat(tools=[WEATHER]), ["It is", " sunny."])

    assert choice["message"] == {"role": "assistant", "content": "It is sunny.", "tool_calls": []}
    assert choice["finish_reason"] == "stop"


def test_a_call_cut_by_max_tokens_stays_text_and_the_finish_reason_length():
    choice = whole_choice(chat(tools=[WEATHER]), [PARIS_CALL[:30]], finish_reason="length")

    assert choice["message"]["content"] == PARIS_CALL[:30] and choice["message"]["tool_calls"] == []
    assert choice["finish_reason"] == "length"


def test_with_tool_choice_none_nothing_is_read_as_a_call():
    choice = whole_choice(chat(tools=[WEATHER], tool_choice="none"), [PARIS_CALL])

    assert choice["message"] == {"role": "assistant", "content": PARIS_CALL}
    assert choice["finish_reason"] == "stop"


def test_a_stream_sends_content_then_each_call_whole_and_finishes_with_tool_calls():
    choices = streamed_choices(chat(tools=[WEATHER], stream=True), SCRIPT)

    deltas = [choice["delta"] for choice in choices]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(delta.get("content", "") for delta in deltas) == "Let me check.\n"
    assert deltas[3] == {"content": "\n"}  # "<tool" is held: it may open a call
    call_deltas = [(i, call) for i, delta in enumerate(deltas) for call in delta.get("tool_calls", [])]
    assert [i for i, _ in call_deltas] == [6, 7]  # when each call is complete
    assert [(call["index"], call["type"], call["function"]["name"], json.loads(call["function"]["arguments"]))
            for _, call in call_deltas] == [(0, "function", "get_weather", {"city": "Paris"}),
                                            (1, "function", "get_weather", {"city": "Rome"})]
    assert call_deltas[0][1]["id"] != call_deltas[1][1]["id"]
    assert [choice["finish_reason"] for choice in choices] == [None] * 8 + ["tool_calls"]
    assert deltas[8] == {}  # the finish comes after the last call, as OpenAI sends it


def test_the_openai_client_reads_a_whole_answers_calls(server, client):
    server.frontend.script = SCRIPT

    completion = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER])

    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    assert [(call.function.name, call.function.arguments) for call in choice.message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]
    [generate_input] = server.frontend.inputs
    assert generate_input.params.structured_output.kind == "grammar"
    assert generate_input.tool_prompt.specs == (WEATHER,)


def test_the_openai_client_stream_helper_assembles_streamed_calls(server, client):
    server.frontend.script = SCRIPT

    with client.chat.completions.stream(model=MODEL, messages=USER, tools=[WEATHER]) as stream:
        events = list(stream)
        completion = stream.get_final_completion()

    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    assert [(call.id.startswith("call_"), call.function.name, call.function.arguments)
            for call in choice.message.tool_calls] == [(True, "get_weather", '{"city": "Paris"}'),
                                                       (True, "get_weather", '{"city": "Rome"}')]
    done = [event for event in events if event.type == "tool_calls.function.arguments.done"]
    assert [(event.index, event.name) for event in done] == [(0, "get_weather"), (1, "get_weather")]
