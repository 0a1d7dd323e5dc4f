"""OpenAI request parsing without a server: what is accepted and how it maps onto
GenerateInputs, and what is refused with which status and param."""
import pytest

from pdserve.protocol.sampling_params import SamplingParams
from pdserve.gateway.front.api_error import ApiError
from pdserve.gateway.front.openai_protocol import (
    MAX_N,
    Endpoint,
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)

MODEL = "m"
MAX_MODEL_LEN = 1024
USER = [{"role": "user", "content": "hi"}]


def completion(**body):
    return parse_completion_request(body, MODEL)


def chat(**body):
    return parse_chat_request(body, MODEL, MAX_MODEL_LEN)


def refusal(parse, **body) -> ApiError:
    """The error `parse` (a helper above, or a parse_* function) raises for `body`."""
    with pytest.raises(ApiError) as caught:
        parse(**body) if parse in (completion, chat) else parse(body, MODEL)
    return caught.value


@pytest.mark.parametrize(
    ("prompt", "text", "token_ids"),
    [
        ("hello", "hello", None),
        ("", "", None),
        ([1, 2, 3], None, [1, 2, 3]),
        (["hello"], "hello", None),
        ([[4, 5]], None, [4, 5]),
    ],
)
def test_a_single_prompt_is_accepted_as_text_or_token_ids(prompt, text, token_ids):
    generate_input = completion(prompt=prompt).generate_input

    assert (generate_input.prompt, generate_input.prompt_token_ids) == (text, token_ids)
    assert generate_input.messages is None
    assert generate_input.request_id is None


def test_a_list_of_prompts_becomes_one_input_per_prompt_with_the_same_parameters():
    parsed = completion(prompt=["a", [1, 2], "b"], max_tokens=3, n=2)

    assert [(i.prompt, i.prompt_token_ids) for i in parsed.inputs] == [("a", None), (None, [1, 2]), ("b", None)]
    assert {i.params for i in parsed.inputs} == {SamplingParams(max_tokens=3)}
    assert parsed.n == 2


@pytest.mark.parametrize("prompt", [[], [1, -2], [1, True], [1.5], {"text": "hi"}, None, 7, ["a", 2], [[]], ["a", []]])
def test_anything_else_as_a_prompt_is_a_400_on_prompt(prompt):
    error = refusal(completion, prompt=prompt)

    assert (error.status, error.param) == (400, "prompt")


def test_completion_defaults_match_openai():
    parsed = completion(prompt="hi")

    assert parsed.endpoint is Endpoint.COMPLETIONS
    assert parsed.generate_input.params == SamplingParams(max_tokens=16)
    assert parsed.generate_input.max_tokens_is_default
    assert (parsed.stream, parsed.include_usage, parsed.n, parsed.echo) == (False, False, 1, False)


def test_nulls_mean_defaults():
    parsed = completion(
        prompt="hi", model=None, max_tokens=None, temperature=None, top_p=None, n=None, stop=None,
        logprobs=None, stream=None, seed=None, top_k=None, echo=None, user=None,
    )

    assert parsed.generate_input.params == SamplingParams(max_tokens=16)


def test_sampling_fields_map_onto_sampling_params():
    params = completion(
        prompt="hi", max_tokens=5, temperature=0, top_p=0.5, top_k=3, min_p=0.2, seed=11, stop="\n",
        stop_token_ids=[9], ignore_eos=True, logprobs=3, include_stop_str_in_output=True,
    ).generate_input.params

    assert params == SamplingParams(
        max_tokens=5, temperature=0, top_p=0.5, top_k=3, min_p=0.2, seed=11, stop=("\n",),
        stop_token_ids=(9,), ignore_eos=True, logprobs=3, include_stop_str_in_output=True,
    )


@pytest.mark.parametrize("top_k", [0, -1])
def test_vllm_spellings_of_top_k_off_turn_it_off(top_k):
    assert completion(prompt="hi", top_k=top_k).generate_input.params.top_k is None


def test_matching_model_and_zero_penalties_are_accepted():
    parsed = completion(prompt="hi", model=MODEL, presence_penalty=0, frequency_penalty=0.0, logit_bias={}, n=1)

    assert parsed.generate_input.prompt == "hi"
    assert not parsed.generate_input.params.adjusts_logits


def test_penalties_min_tokens_and_logit_bias_reach_the_sampling_params():
    parsed = completion(prompt="hi", presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.2,
                        min_tokens=3, logit_bias={"50": 2.5, "7": -100})

    params = parsed.generate_input.params
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -1, 1.2)
    assert (params.min_tokens, params.logit_bias) == (3, ((7, -100.0), (50, 2.5)))


def test_another_model_is_a_404_model_not_found():
    error = refusal(completion, prompt="hi", model="other")

    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert error.body()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"n": 0}, "n", f"[1, {MAX_N}]"),
        ({"n": MAX_N + 1}, "n", f"n={MAX_N + 1}"),
        ({"n": True}, "n", "integer"),
        ({"best_of": 2}, "best_of", "only best_of=n"),
        ({"n": 3, "best_of": 2}, "best_of", "at least n=3"),
        ({"best_of": "2"}, "best_of", "integer"),
        ({"use_beam_search": True}, "use_beam_search", "not supported"),
        ({"echo": True, "logprobs": 0}, "echo", "prompt's logprobs"),
        ({"echo": 1}, "echo", "bool"),
        ({"suffix": "x"}, "suffix", "not supported"),
        ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty=2.5"),
        ({"frequency_penalty": "1"}, "frequency_penalty", "must be a number"),
        ({"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty=0"),
        ({"min_tokens": 17}, "min_tokens", "max_tokens=16"),
        ({"logit_bias": {"1": 500}}, "logit_bias", "[-100.0, 100.0]"),
        ({"logit_bias": {"x1": 5}}, "logit_bias", "not a token id"),
        ({"logit_bias": {"-1": 5}}, "logit_bias", "not a token id"),
        ({"logit_bias": [1, 5]}, "logit_bias", "must be an object"),
        ({"stop": {"a": 1}}, "stop", "string or a list"),
        ({"stop": ["a", 2]}, "stop", "only str"),
        ({"seed": "7"}, "seed", "integer"),
        ({"logprobs": True}, "logprobs", "integer"),
        ({"top_k": -2}, "top_k", "top_k=-2"),
        ({"min_p": 2}, "min_p", "min_p=2"),
        ({"ignore_eos": "yes"}, "ignore_eos", "bool"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options", "bool"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options", "not supported"),
        ({"user": 5}, "user", "string"),
        ({"functions": []}, "functions", "Unrecognized"),
    ],
)
def test_bad_completion_fields_are_400s_naming_the_field(body, param, fragment):
    error = refusal(completion, prompt="hi", **body)

    assert (error.status, error.param, error.error_type) == (400, param, "invalid_request_error")
    assert fragment in error.message


def test_n_echo_and_a_matching_best_of_are_accepted():
    parsed = completion(prompt="hi", n=3, best_of=3, echo=True, use_beam_search=False)

    assert (parsed.n, parsed.echo) == (3, True)


def test_include_usage_needs_and_follows_stream():
    assert completion(prompt="hi", stream=True, stream_options={"include_usage": True}).include_usage
    assert not completion(prompt="hi", stream=True, stream_options={}).include_usage


def test_a_non_object_body_is_a_400():
    with pytest.raises(ApiError) as caught:
        parse_completion_request([1, 2], MODEL)

    assert caught.value.status == 400


def test_chat_without_max_tokens_may_fill_the_context():
    parsed = chat(messages=USER)

    assert parsed.endpoint is Endpoint.CHAT
    assert parsed.generate_input.messages == USER
    assert parsed.generate_input.params.max_tokens == MAX_MODEL_LEN
    assert parsed.generate_input.max_tokens_is_default


def test_chat_accepts_n_and_message_names():
    parsed = chat(messages=[{"role": "user", "content": "hi", "name": "ada"}], n=4)

    assert parsed.n == 4
    assert parsed.generate_input.messages == [{"role": "user", "content": "hi", "name": "ada"}]


def test_chat_prefers_max_completion_tokens_over_the_deprecated_max_tokens():
    parsed = chat(messages=USER, max_tokens=50, max_completion_tokens=7)

    assert parsed.generate_input.params.max_tokens == 7
    assert not parsed.generate_input.max_tokens_is_default
    assert chat(messages=USER, max_tokens=50).generate_input.params.max_tokens == 50


def test_chat_logprobs_flag_and_top_logprobs_become_one_count():
    assert chat(messages=USER).generate_input.params.logprobs is None
    assert chat(messages=USER, logprobs=False).generate_input.params.logprobs is None
    assert chat(messages=USER, logprobs=True).generate_input.params.logprobs == 0
    assert chat(messages=USER, logprobs=True, top_logprobs=4).generate_input.params.logprobs == 4


def test_chat_errors_use_the_request_field_names():
    too_many = refusal(chat, messages=USER, logprobs=True, top_logprobs=21)
    assert (too_many.param, too_many.message.split("=")[0]) == ("top_logprobs", "top_logprobs")
    zero = refusal(chat, messages=USER, max_completion_tokens=0)
    assert zero.param == "max_completion_tokens" and zero.message.startswith("max_completion_tokens=0")
    assert refusal(chat, messages=USER, logprobs="yes").param == "logprobs"


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        (None, "non-empty list"),
        ("hi", "non-empty list"),
        (["hi"], "messages[0] must be an object"),
        ([{"content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "only text parts"),
        ([USER[0], {"role": "tool", "content": "b"}], "messages[1].tool_call_id must be a string"),
        ([USER[0], {"role": "user", "content": "b", "tool_call_id": "1"}], "messages[1].tool_call_id is not supported"),
        ([{"role": "assistant", "content": None}], "messages[0].content"),
        ([{"role": "assistant", "content": None, "tool_calls": []}], "messages[0].tool_calls must be a non-empty"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
          "function": {"name": "f", "arguments": "[1]"}}]}], "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
          "function": {"name": "f", "arguments": "{"}}]}], "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
         "messages[0].tool_calls[0].id"),
        ([{"role": "user", "content": "hi", "name": 7}], "messages[0].name"),
    ],
)
def test_bad_messages_are_400s_saying_which_message(messages, fragment):
    error = refusal(chat, messages=messages)

    assert (error.status, error.param) == (400, "messages")
    assert fragment in error.message


def test_tokenize_takes_a_text_prompt_or_chat_messages():
    assert parse_tokenize_request({"model": MODEL, "prompt": "hi"}, MODEL).prompt == "hi"
    assert parse_tokenize_request({"messages": USER}, MODEL).messages == USER


@pytest.mark.parametrize(
    ("body", "param"),
    [({}, "prompt"), ({"prompt": "a", "messages": USER}, "prompt"), ({"prompt": [1]}, "prompt"),
     ({"prompt": "a", "add_special_tokens": False}, "add_special_tokens"), ({"messages": []}, "messages")],
)
def test_bad_tokenize_bodies_are_400s(body, param):
    error = refusal(parse_tokenize_request, **body)

    assert (error.status, error.param) == (400, param)


def test_detokenize_takes_token_ids():
    assert parse_detokenize_request({"tokens": [1, 2]}, MODEL) == [1, 2]
    assert refusal(parse_detokenize_request, tokens=[1, -1]).param == "tokens"
    assert refusal(parse_detokenize_request, tokens=[1], model="other").status == 404
