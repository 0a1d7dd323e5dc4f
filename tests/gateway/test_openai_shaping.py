"""OpenAI response shaping without a server: the JSON shapes of whole answers and streamed
events, choice indexes, echo, and usage over several choices."""
import math

from pdserve.protocol.outputs import TokenLogprobs
from pdserve.gateway.front.frontend_types import StreamChunk
from pdserve.gateway.front.openai_protocol import parse_chat_request, parse_completion_request
from pdserve.gateway.front.openai_shaping import MIN_LOGPROB, create_shaper

MODEL = "m"
USER = [{"role": "user", "content": "hi"}]
TEXTS = {1: "a", 2: "bc", 3: "é"}


def completion(**body):
    return parse_completion_request(body, MODEL)


def chat(**body):
    return parse_chat_request(body, MODEL, 1024)


def decode(token_ids: list[int]) -> str:
    return "".join(TEXTS[token_id] for token_id in token_ids)


def shaper_for(parsed, created_s: int = 0):
    return create_shaper(parsed, "r1", MODEL, created_s, decode)


def chunk(text: str, token_ids: list[int], finish_reason=None, logprobs=(), completion_tokens=1,
          prompt_tokens=3) -> StreamChunk:
    return StreamChunk(
        request_id="engine-id", token_ids=token_ids, text=text, logprobs=list(logprobs),
        finish_reason=finish_reason, stop_reason=None, prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
    )


def test_completion_shaper_builds_the_whole_response():
    shaper = shaper_for(completion(prompt="hi", logprobs=1), 1700000000)
    chunks = [
        chunk("a", [1], logprobs=[TokenLogprobs(1, -0.5, (2,), (-0.1,))]),
        chunk("bc", [2], "length", logprobs=[TokenLogprobs(2, -math.inf, (2,), (-0.1,))], completion_tokens=2),
    ]

    assert shaper.response([chunks]) == {
        "id": "cmpl-r1",
        "object": "text_completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "text": "abc",
                "logprobs": {
                    "tokens": ["a", "bc"],
                    "token_logprobs": [-0.5, MIN_LOGPROB],
                    "top_logprobs": [{"bc": -0.1, "a": -0.5}, {"bc": -0.1}],
                    "text_offset": [0, 1],
                },
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def test_a_chunk_with_nothing_new_is_not_streamed():
    shaper = shaper_for(completion(prompt="hi", stream=True))

    assert shaper.chunk_events(0, chunk("", [])) == []
    assert len(shaper.chunk_events(0, chunk("", [3]))) == 1  # a token whose text is held back still counts


def test_chat_stream_opens_with_the_role_once_and_closes_with_finish_and_usage():
    parsed = chat(messages=USER, stream=True, stream_options={"include_usage": True})
    shaper = shaper_for(parsed, 5)

    first = shaper.chunk_events(0, chunk("a", [1]))
    last = shaper.chunk_events(0, chunk("", [], "stop", completion_tokens=1))
    tail = shaper.usage_event()

    deltas = [event["choices"][0]["delta"] for event in first]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "a"}]
    assert all(event["object"] == "chat.completion.chunk" and event["usage"] is None for event in first + last)
    [finish] = last
    assert (finish["choices"][0]["delta"], finish["choices"][0]["finish_reason"]) == ({}, "stop")
    assert tail["choices"] == []
    assert tail["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def test_chat_logprobs_carry_utf8_bytes_and_exactly_the_top_entries():
    shaper = shaper_for(chat(messages=USER, logprobs=True, top_logprobs=1))

    response = shaper.response([[chunk("é", [3], "stop", logprobs=[TokenLogprobs(3, -1.0, (1,), (-0.5,))])]])

    assert response["object"] == "chat.completion"
    assert response["choices"][0]["message"] == {"role": "assistant", "content": "é"}
    assert response["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": "é",
                "logprob": -1.0,
                "bytes": [0xC3, 0xA9],
                "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [0x61]}],
            }
        ]
    }


def test_choices_of_several_prompts_keep_their_index_and_count_each_prompt_once():
    shaper = shaper_for(completion(prompt=["x", "yy"], n=2))
    chunks_by_choice = [
        [chunk("a", [1], "length", completion_tokens=1, prompt_tokens=prompt_tokens)]
        for prompt_tokens in (3, 3, 5, 5)
    ]

    response = shaper.response(chunks_by_choice)

    assert [choice["index"] for choice in response["choices"]] == [0, 1, 2, 3]
    assert response["usage"] == {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}


def test_streamed_choices_keep_their_own_offsets_and_sum_into_the_usage_event():
    shaper = shaper_for(completion(prompt="x", n=2, logprobs=0, stream=True, stream_options={"include_usage": True}))
    entry = [TokenLogprobs(2, -0.5, (), ())]

    events = [
        shaper.chunk_events(0, chunk("bc", [2], logprobs=entry)),
        shaper.chunk_events(1, chunk("bc", [2], logprobs=entry)),
        shaper.chunk_events(0, chunk("bc", [2], "length", logprobs=entry, completion_tokens=2)),
        shaper.chunk_events(1, chunk("bc", [2], "length", logprobs=entry, completion_tokens=2)),
    ]

    offsets = [(e["choices"][0]["index"], e["choices"][0]["logprobs"]["text_offset"]) for [e] in events]
    assert offsets == [(0, [0]), (1, [0]), (0, [2]), (1, [2])]
    assert all(e["id"] == "cmpl-r1" and e["usage"] is None for [e] in events)
    assert shaper.usage_event()["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_streamed_chat_opens_each_choice_with_its_role():
    shaper = shaper_for(chat(messages=USER, n=2, stream=True))

    first_of_1 = shaper.chunk_events(1, chunk("a", [1]))
    first_of_0 = shaper.chunk_events(0, chunk("a", [1]))
    second_of_1 = shaper.chunk_events(1, chunk("a", [1]))

    assert [e["choices"][0]["index"] for e in first_of_1 + first_of_0 + second_of_1] == [1, 1, 0, 0, 1]
    assert first_of_0[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "usage" not in second_of_1[0]


def test_echo_prefixes_the_prompt_once_per_choice():
    streaming = shaper_for(completion(prompt=[1, 2], n=2, echo=True, stream=True))

    texts = [streaming.chunk_events(index, chunk("é", [3]))[0]["choices"][0]["text"] for index in (0, 1, 0)]

    assert texts == ["abcé", "abcé", "é"]
    whole = shaper_for(completion(prompt="say:", echo=True)).response([[chunk("é", [3], "stop")]])
    assert whole["choices"][0]["text"] == "say:é"
