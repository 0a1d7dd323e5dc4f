"""Every failure is an OpenAI JSON error with the right status: 400 bad input (field named),
404 unknown model or route, 503 unavailable; after a stream has started, an SSE error event."""
import json

import pytest

MODEL = "fake-model"
CHAT = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def post(server, path: str, body: object):
    return server.request("POST", path, json_body=body)


def error_of(response) -> dict:
    assert response.content_type.startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_malformed_json_is_a_400_with_a_json_error_body(server):
    response = server.request("POST", "/v1/completions", raw_body=b'{"prompt": "hi",')

    assert response.status == 400
    error = error_of(response)
    assert "not valid JSON" in error["message"] and error["type"] == "invalid_request_error"


def test_a_body_that_is_not_an_object_is_a_400(server):
    assert post(server, "/v1/chat/completions", ["hi"]).status == 400


def test_unknown_model_is_a_404_model_not_found(server):
    response = post(server, "/v1/completions", {"model": "gpt-9", "prompt": "hi"})

    assert response.status == 404
    error = error_of(response)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "gpt-9" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "param", "fragment"),
    [
        ("/v1/completions", {"prompt": "hi", "n": 0}, "n", "n=0"),
        ("/v1/completions", {"prompt": "hi", "n": 129}, "n", "[1, 128]"),
        ("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 1}, "best_of", "at least n=2"),
        ("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 3}, "best_of", "only best_of=n"),
        ("/v1/completions", {"prompt": "hi", "n": 2, "use_beam_search": True}, "use_beam_search", "not supported"),
        ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature", "temperature=-1"),
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature", "must be a number"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens", "max_tokens=0"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs", "logprobs=21"),
        ("/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 1}, "echo", "prompt's logprobs"),
        ("/v1/completions", {"prompt": "hi", "echo": "yes"}, "echo", "bool"),
        ("/v1/completions", {"prompt": ["a", [1, -2]]}, "prompt", "prompt[1]"),
        ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream", "bool"),
        ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty", "repetition_penalty=0"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"1": 101}}, "logit_bias", "must be in"),
        ("/v1/completions", {"prompt": "hi", "guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ("/v1/completions", {"prompt": "hi", "guided_json": [1]}, "guided_json", "must be a JSON schema"),
        ("/v1/completions", {"prompt": "hi", "guided_regex": "a", "guided_choice": ["b"]}, "guided_regex",
         "at most one"),
        ("/v1/completions", {"prompt": "hi", "guided_choice": ["a", ""]}, "guided_choice", "non-empty strings"),
        ("/v1/completions", {"prompt": "hi", "structured_outputs": {"structural_tag": "t"}}, "structured_outputs",
         "not supported"),
        ("/v1/completions", {"prompt": "hi", "structured_outputs": {}}, "structured_outputs", "exactly one"),
        ("/v1/completions", {"prompt": "hi", "guided_regex": "a+", "ignore_eos": True}, "ignore_eos",
         "structured output"),
        ("/v1/completions", {"prompt": "hi", "stream_options": {}}, "stream_options", "stream=true"),
        ("/v1/completions", {}, "prompt", "required"),
        ("/v1/chat/completions", {"messages": CHAT, "top_p": 0}, "top_p", "top_p=0"),
        ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": -5}, "max_completion_tokens", "-5"),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 30}, "top_logprobs", "=30"),
        ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "top_logprobs", "logprobs=true"),
        ("/v1/chat/completions", {"messages": []}, "messages", "non-empty"),
        ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "xml"}}, "response_format",
         "type must be"),
        ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_schema"}}, "response_format",
         "with a name"),
        ("/v1/chat/completions", {"messages": CHAT, "tools": []}, "tools", "non-empty list"),
        ("/v1/chat/completions", {"messages": CHAT, "tool_choice": "required"}, "tool_choice", "needs tools"),
        ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, "tool_choice": {"type": "function",
         "function": {"name": "nope"}}}, "tool_choice", "not among the tools"),
        ("/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, "guided_regex": "a+"}, "guided_regex",
         "cannot be combined with tools"),
        ("/v1/chat/completions", {"messages": CHAT, "echo": True}, "echo", "Unrecognized"),
        ("/v1/chat/completions", {"messages": CHAT, "n": 0}, "n", "n=0"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a", "name": 3}]}, "messages", ".name"),
        ("/tokenize", {"prompt": "hi", "messages": CHAT}, "prompt", "exactly one"),
        ("/tokenize", {"prompt": [1, 2]}, "prompt", "string"),
        ("/detokenize", {"tokens": "12"}, "tokens", "list of token ids"),
        ("/detokenize", {"tokens": [5000]}, "tokens", "[0, 200)"),
    ],
)
def test_invalid_fields_are_400s_that_name_the_field(server, path, body, param, fragment):
    response = post(server, path, {"model": MODEL} | body)

    assert response.status == 400
    error = error_of(response)
    assert error["param"] == param
    assert fragment in error["message"]
    assert server.frontend.inputs == []


@pytest.mark.parametrize("stream", [False, True])
def test_input_the_frontend_rejects_is_a_400_even_when_streaming(server, stream):
    response = post(server, "/v1/completions", {"prompt": "invalid", "stream": stream})

    assert response.status == 400
    assert "too long" in error_of(response)["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_unavailable_frontend_is_a_503_even_when_streaming(server, stream):
    response = post(server, "/v1/completions", {"prompt": "unavailable", "stream": stream})

    assert response.status == 503
    assert "no live decode replica" in error_of(response)["message"]


def test_a_failure_mid_stream_becomes_an_error_event_before_done(server):
    response = post(server, "/v1/completions", {"prompt": "fail midway", "max_tokens": 5, "stream": True})

    assert response.status == 200
    assert response.content_type.startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    *tokens, error_event = [json.loads(event) for event in events[:-1]]
    assert [token["choices"][0]["text"] for token in tokens] == [" Hello", ","]
    assert "went away" in error_event["error"]["message"]


def test_unknown_route_is_a_json_404(server):
    response = server.request("GET", "/v1/engines")

    assert response.status == 404
    error_of(response)


def test_health_follows_the_frontend(server):
    assert server.request("GET", "/health").status == 200
    server.frontend.healthy = False
    assert server.request("GET", "/health").status == 503
