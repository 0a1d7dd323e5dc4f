"""The parts of the OpenAI surface vLLM users reach for, driven by the official openai client:
several choices (`n`), a list of prompts, `echo`, message `name`, X-Request-Id, usage over
several choices, and vLLM's /tokenize and /detokenize."""
import openai
import pytest

from tests.gateway.conftest import BOS, MAX_MODEL_LEN, fake_text

MODEL = "fake-model"
CHAT = [{"role": "user", "content": "hi"}]


def texts_by_index(chunks) -> dict[int, str]:
    """Each choice's streamed text, from completion chunks (`text`) or chat chunks (`delta`)."""
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            piece = choice.delta.content or "" if chunk.object == "chat.completion.chunk" else choice.text
            texts[choice.index] = texts.get(choice.index, "") + piece
    return texts


def shifted_text(num_tokens: int, seed: int) -> str:
    """What the fake generates for a choice with this seed (its tokens start `seed` later)."""
    return fake_text(num_tokens + seed)[len(fake_text(seed)):]


def test_n_choices_are_separate_requests_with_derived_seeds(server, client):
    completion = client.completions.create(
        model=MODEL, prompt="say hello", max_tokens=2, n=3, seed=5, extra_headers={"X-Request-Id": "many"}
    )

    assert completion.id == "cmpl-many"
    assert [choice.index for choice in completion.choices] == [0, 1, 2]
    assert [choice.text for choice in completion.choices] == [shifted_text(2, seed) for seed in (5, 6, 7)]
    received = server.frontend.inputs
    assert sorted(r.request_id for r in received) == ["many-0", "many-1", "many-2"]
    assert sorted(r.params.seed for r in received) == [5, 6, 7]
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (2, 6, 8)


def test_without_a_seed_each_choice_draws_its_own(server, client):
    completion = client.completions.create(model=MODEL, prompt="hi", max_tokens=1, n=2)

    assert len(completion.choices) == 2
    assert [r.params.seed for r in server.frontend.inputs] == [None, None]


def test_streamed_choices_carry_their_index_and_one_usage_at_the_end(client):
    stream = client.completions.create(
        model=MODEL, prompt="say hello", max_tokens=3, n=2, seed=0, stream=True,
        stream_options={"include_usage": True},
    )
    *chunks, usage_chunk = list(stream)

    assert all(len(chunk.choices) == 1 for chunk in chunks)
    assert texts_by_index(chunks) == {0: shifted_text(3, 0), 1: shifted_text(3, 1)}
    finishes = [(c.choices[0].index, c.choices[0].finish_reason) for c in chunks if c.choices[0].finish_reason]
    assert sorted(finishes) == [(0, "length"), (1, "length")]
    assert usage_chunk.choices == []
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (2, 6)


def test_a_prompt_list_gets_n_choices_per_prompt_numbered_prompt_major(server, client):
    completion = client.completions.create(model=MODEL, prompt=["say hello", [7, 8, 9]], max_tokens=1, n=2)

    assert [choice.index for choice in completion.choices] == [0, 1, 2, 3]
    by_id = {r.request_id.rsplit("-", 1)[1]: r for r in server.frontend.inputs}
    assert [by_id[str(index)].prompt for index in range(4)] == ["say hello", "say hello", None, None]
    assert by_id["3"].prompt_token_ids == [7, 8, 9]
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (2 + 3, 4)  # each prompt counted once


def test_one_bad_prompt_of_a_list_fails_the_request_and_closes_the_others(server, client):
    with pytest.raises(openai.BadRequestError, match="too long"):
        client.completions.create(model=MODEL, prompt=["slow", "invalid"], stream=True)

    assert server.frontend.closed_early_seen.wait(3.0)


def test_streamed_chat_choices_each_open_with_the_role(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, n=2, seed=1, stream=True, stream_options={"include_usage": True}
    )
    *chunks, usage_chunk = list(stream)

    roles = [(c.choices[0].index, c.choices[0].delta.role) for c in chunks if c.choices[0].delta.role]
    assert sorted(roles) == [(0, "assistant"), (1, "assistant")]
    assert texts_by_index(chunks) == {0: shifted_text(2, 1), 1: shifted_text(2, 2)}
    assert usage_chunk.usage.completion_tokens == 4


def test_whole_chat_answer_has_one_message_per_choice(client):
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1, n=2, seed=0)

    assert [(c.index, c.message.content) for c in chat.choices] == [(0, " Hello"), (1, ",")]
    assert chat.usage.completion_tokens == 2


def test_echo_puts_the_prompt_before_the_completion(client):
    whole = client.completions.create(model=MODEL, prompt="say:", max_tokens=2, echo=True)
    streamed = list(client.completions.create(model=MODEL, prompt="say:", max_tokens=2, echo=True, stream=True))

    assert whole.choices[0].text == "say: Hello,"
    assert [chunk.choices[0].text for chunk in streamed] == ["say: Hello", ","]


def test_echo_of_token_ids_decodes_them(client):
    completion = client.completions.create(model=MODEL, prompt=[102, 103], max_tokens=1, echo=True)

    assert completion.choices[0].text == " wörld! Hello"


def test_a_bad_n_and_best_of_or_echo_combination_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError, match="best_of=1 must be at least n=2") as caught:
        client.completions.create(model=MODEL, prompt="hi", n=2, best_of=1)
    assert caught.value.body["param"] == "best_of"
    with pytest.raises(openai.BadRequestError, match="echo with logprobs") as caught:
        client.completions.create(model=MODEL, prompt="hi", n=2, echo=True, logprobs=1)
    assert caught.value.body["param"] == "echo"


def test_message_names_are_accepted_and_reach_the_chat_template(server, client):
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi", "name": "ada"}], max_tokens=1
    )

    assert server.frontend.inputs[0].messages == [{"role": "user", "content": "hi", "name": "ada"}]


def test_x_request_id_is_honoured_and_returned(server, client):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hi", max_tokens=1, extra_headers={"X-Request-Id": "trace-42"}
    )

    assert raw.headers["X-Request-Id"] == "trace-42"
    assert raw.parse().id == "cmpl-trace-42"
    assert server.frontend.inputs[0].request_id == "trace-42"


def test_without_x_request_id_a_fresh_one_names_the_answer(client):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=1, stream=True)

    request_id = raw.headers["X-Request-Id"]
    assert len(request_id) == 32
    assert all(chunk.id == f"chatcmpl-{request_id}" for chunk in raw.parse())


def test_a_malformed_x_request_id_is_a_400_naming_the_header(client):
    with pytest.raises(openai.BadRequestError, match="X-Request-Id") as caught:
        client.completions.create(model=MODEL, prompt="hi", extra_headers={"X-Request-Id": "a b"})

    assert caught.value.body["param"] == "X-Request-Id"


@pytest.fixture
def root_client(server):
    """An openai client at the server's root, where vLLM serves /tokenize and /detokenize."""
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=10) as client:
        yield client


def test_tokenize_counts_a_prompt_as_generation_would(server, root_client):
    answer = root_client.post("/tokenize", body={"model": MODEL, "prompt": " Hello, wörld!"}, cast_to=object)

    assert answer == {"count": 4, "max_model_len": MAX_MODEL_LEN, "tokens": [100, 101, 102, 103], "token_strs": None}


def test_tokenize_renders_chat_messages(server, root_client):
    messages = [{"role": "system", "content": "!"}, {"role": "user", "content": ",", "name": "ada"}]
    answer = root_client.post("/tokenize", body={"model": MODEL, "messages": messages}, cast_to=object)

    assert answer["tokens"] == [BOS, 103, BOS, 101]
    assert server.frontend.prompts.inputs[0].messages == messages


def test_detokenize_turns_tokens_back_into_text(root_client):
    answer = root_client.post("/detokenize", body={"model": MODEL, "tokens": [100, 101, 102, 103]}, cast_to=object)

    assert answer == {"prompt": " Hello, wörld!"}


def test_tokenize_of_another_model_is_a_404(root_client):
    with pytest.raises(openai.NotFoundError):
        root_client.post("/tokenize", body={"model": "other", "prompt": "hi"}, cast_to=object)
