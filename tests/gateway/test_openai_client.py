"""The official openai client, unmodified, talks to the HTTP front: completions and chat,
streamed and whole, with logprobs, usage and the vLLM extras."""
import openai
import pytest

from pdserve.gateway.front.openai_protocol import COMPLETION_DEFAULT_MAX_TOKENS

MODEL = "fake-model"
MAX_MODEL_LEN = 4096
REQUEST_ID = {"X-Request-Id": "req-1"}
TEXT_4 = " Hello, wörld!"  # what the fake frontend generates first, one token per piece
TOKENS_4 = [" Hello", ",", " wörld", "!"]


def test_completion_returns_the_generated_text_and_usage(server, client):
    completion = client.completions.create(model=MODEL, prompt="say hello", max_tokens=3, extra_headers=REQUEST_ID)

    assert completion.object == "text_completion"
    assert completion.id == "cmpl-req-1"
    assert completion.model == MODEL
    assert completion.created > 0
    [choice] = completion.choices
    assert (choice.index, choice.text, choice.finish_reason) == (0, " Hello, wörld", "length")
    assert choice.logprobs is None
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (2, 3, 5)
    assert server.frontend.closed_early == []


def test_completion_passes_sampling_fields_and_vllm_extras(server, client):
    client.completions.create(
        model=MODEL,
        prompt=[5, 6, 7],
        max_tokens=2,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        stop=["zzz"],
        extra_body={"top_k": 20, "min_p": 0.1, "ignore_eos": True, "stop_token_ids": [2]},
    )

    [received] = server.frontend.inputs
    assert received.prompt is None and received.prompt_token_ids == [5, 6, 7]
    params = received.params
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (2, 0.5, 0.9, 7)
    assert (params.top_k, params.min_p, params.ignore_eos) == (20, 0.1, True)
    assert (params.stop, params.stop_token_ids, params.logprobs) == (("zzz",), (2,), None)
    assert not received.max_tokens_is_default


def test_completion_without_max_tokens_asks_for_sixteen_tokens(server, client):
    completion = client.completions.create(model=MODEL, prompt="hi")

    assert completion.usage.completion_tokens == COMPLETION_DEFAULT_MAX_TOKENS
    assert server.frontend.inputs[0].max_tokens_is_default


def test_completion_stops_at_a_stop_string_and_reports_it(client):
    completion = client.completions.create(model=MODEL, prompt="hi", max_tokens=10, stop="wörld")

    [choice] = completion.choices
    assert (choice.text, choice.finish_reason, choice.stop_reason) == (" Hello, ", "stop", "wörld")


def test_completion_can_keep_the_stop_string(client):
    completion = client.completions.create(
        model=MODEL, prompt="hi", max_tokens=10, stop="wörld", extra_body={"include_stop_str_in_output": True}
    )

    assert completion.choices[0].text == " Hello, wörld"


def test_streamed_completion_yields_the_same_text_then_usage(server, client):
    stream = client.completions.create(
        model=MODEL, prompt="say hello", max_tokens=4, stream=True, stream_options={"include_usage": True},
        extra_headers=REQUEST_ID,
    )
    chunks = list(stream)

    *content, usage_chunk = chunks
    assert [c.choices[0].text for c in content] == TOKENS_4
    assert [c.choices[0].finish_reason for c in content] == [None, None, None, "length"]
    assert all(c.id == "cmpl-req-1" and c.object == "text_completion" and c.usage is None for c in content)
    assert usage_chunk.choices == []
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (2, 4)
    assert server.frontend.closed_early == []


def test_streamed_completion_without_include_usage_has_no_usage_chunk(client):
    chunks = list(client.completions.create(model=MODEL, prompt="hi", max_tokens=2, stream=True))

    assert [c.choices[0].text for c in chunks] == TOKENS_4[:2]


def test_completion_logprobs_come_in_the_legacy_completions_shape(client):
    completion = client.completions.create(model=MODEL, prompt="hi", max_tokens=4, logprobs=2)

    logprobs = completion.choices[0].logprobs
    assert logprobs.tokens == TOKENS_4
    assert logprobs.token_logprobs == [-0.25] * 4
    assert logprobs.top_logprobs[0] == {" Hello": -0.25, ",": -2.0}
    assert logprobs.top_logprobs[3] == {"!": -0.25, " Hello": -2.0}
    assert logprobs.text_offset == [0, 6, 7, 13]


def test_completion_logprobs_zero_still_reports_the_sampled_token(client):
    completion = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, logprobs=0)

    assert completion.choices[0].logprobs.top_logprobs == [{" Hello": -0.25}, {",": -0.25}]


def test_streamed_completion_logprobs_keep_counting_text_offsets_across_chunks(client):
    stream = client.completions.create(model=MODEL, prompt="hi", max_tokens=4, logprobs=1, stream=True)

    offsets = [offset for chunk in stream for offset in chunk.choices[0].logprobs.text_offset]
    assert offsets == [0, 6, 7, 13]


def test_chat_completion_answers_as_the_assistant(server, client):
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello?"}],
        max_completion_tokens=4,
        extra_headers=REQUEST_ID,
    )

    assert chat.object == "chat.completion"
    assert chat.id == "chatcmpl-req-1"
    [choice] = chat.choices
    assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", TEXT_4, "length")
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (2, 4)
    [received] = server.frontend.inputs
    assert received.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello?"}]
    assert received.params.max_tokens == 4


def test_chat_content_parts_are_joined_into_text(server, client):
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "2"}]}],
        max_tokens=1,
    )

    assert server.frontend.inputs[0].messages == [{"role": "user", "content": "one\n2"}]


def test_chat_without_max_tokens_may_fill_the_context(server, client):
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stop=["!"])

    assert chat.choices[0].message.content == " Hello, wörld"
    received = server.frontend.inputs[0]
    assert received.params.max_tokens == MAX_MODEL_LEN and received.max_tokens_is_default


def test_streamed_chat_opens_with_the_role_and_ends_with_usage(server, client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=REQUEST_ID,
    )
    chunks = list(stream)

    role_chunk, *content, usage_chunk = chunks
    assert role_chunk.choices[0].delta.role == "assistant"
    assert role_chunk.choices[0].delta.content == ""
    assert [c.choices[0].delta.content for c in content] == TOKENS_4
    assert [c.choices[0].finish_reason for c in content] == [None, None, None, "length"]
    assert all(c.object == "chat.completion.chunk" and c.id == "chatcmpl-req-1" for c in chunks)
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 4
    assert server.frontend.closed_early == []


def test_chat_logprobs_come_in_the_chat_shape(client):
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3, logprobs=True, top_logprobs=2
    )

    content = chat.choices[0].logprobs.content
    assert [entry.token for entry in content] == TOKENS_4[:3]
    assert content[2].bytes == list(" wörld".encode())
    assert content[0].logprob == -0.25
    assert [(top.token, top.logprob) for top in content[0].top_logprobs] == [(" Hello", -0.25), (",", -2.0)]


def test_chat_logprobs_without_top_logprobs_list_only_the_sampled_tokens(server, client):
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, logprobs=True
    )

    assert server.frontend.inputs[0].params.logprobs == 0
    assert [(entry.token, entry.top_logprobs) for entry in chat.choices[0].logprobs.content] == [
        (" Hello", []),
        (",", []),
    ]


def test_streamed_chat_carries_logprobs_per_chunk(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, logprobs=True, stream=True
    )

    logprobs = [chunk.choices[0].logprobs for chunk in stream]
    tokens = [entry.token for entry_list in logprobs if entry_list for entry in entry_list.content]
    assert tokens == [" Hello", ","]


def test_errors_reach_the_client_as_typed_openai_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other-model", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="n=0"):
        client.completions.create(model=MODEL, prompt="hi", n=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=-1)


def test_models_lists_the_served_model_with_its_context_length(client):
    [model] = client.models.list().data

    assert (model.id, model.object, model.max_model_len) == (MODEL, "model", MAX_MODEL_LEN)
