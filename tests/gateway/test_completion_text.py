"""The gateway's completion text: it trusts the replica's finish reason for token-based ends
(EOS, stop tokens, max_tokens) and finds stop strings itself, never streaming past one."""
from pdserve.protocol.sampling_params import SamplingParams
from pdserve.gateway.disaggregated.completion_text import CompletionText, SampledToken


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def feed(text: CompletionText, tokenizer, body: str, finish_reason=None, stop_token_id=None):
    """Pushes `body` one token at a time, the last one carrying the replica's finish reason."""
    token_ids = ids(tokenizer, body)
    chunks = [text.push(SampledToken(token_id, None)) for token_id in token_ids[:-1]]
    chunks.append(text.push(SampledToken(token_ids[-1], None, finish_reason, stop_token_id)))
    return chunks


def completion(tokenizer, **params) -> CompletionText:
    return CompletionText(tokenizer, "r1", ids(tokenizer, "prompt: "), SamplingParams(**params))


def test_the_replicas_length_ends_the_request_with_every_character(byte_tokenizer):
    text = completion(byte_tokenizer, max_tokens=5)
    chunks = feed(text, byte_tokenizer, "héllo"[:4], finish_reason="length")
    assert "".join(chunk.text for chunk in chunks) == text.text == "héll"
    assert [chunk.finish_reason for chunk in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert chunks[-1].completion_tokens == len(chunks) == 5  # é is two byte tokens


def test_eos_reported_by_the_replica_ends_with_stop_and_no_stop_reason(byte_tokenizer):
    text = completion(byte_tokenizer)
    feed(text, byte_tokenizer, "hi")
    last = text.push(SampledToken(byte_tokenizer.eos_token_id, None, "stop", None))
    assert (last.finish_reason, last.stop_reason, text.text) == ("stop", None, "hi")


def test_a_stop_token_ends_without_its_text_unless_asked(byte_tokenizer):
    x_id = ids(byte_tokenizer, "x")[0]
    for include, expected in ((False, "ab"), (True, "abx")):
        text = completion(byte_tokenizer, stop_token_ids=[x_id], include_stop_str_in_output=include)
        chunks = feed(text, byte_tokenizer, "abx", finish_reason="stop", stop_token_id=x_id)
        assert (chunks[-1].finish_reason, chunks[-1].stop_reason) == ("stop", x_id)
        assert "".join(chunk.text for chunk in chunks) == text.text == expected


def test_a_stop_string_split_over_tokens_is_held_back_then_cut(byte_tokenizer):
    text = completion(byte_tokenizer, stop=["END"])
    chunks = feed(text, byte_tokenizer, "abEN")
    assert "".join(chunk.text for chunk in chunks) == "ab"  # "EN" may begin the stop string
    last = feed(text, byte_tokenizer, "D")[0]
    assert (last.finish_reason, last.stop_reason, last.text) == ("stop", "END", "")
    assert text.finished and text.text == "ab"


def test_held_back_text_that_is_no_stop_string_is_streamed_later(byte_tokenizer):
    text = completion(byte_tokenizer, stop=["END"])
    chunks = feed(text, byte_tokenizer, "aENx") + feed(text, byte_tokenizer, "y", finish_reason="length")
    assert [chunk.text for chunk in chunks] == ["", "", "a", "E", "Nxy"]  # the last 2 wait


def test_a_stop_string_wins_over_the_replicas_length_on_the_same_token(byte_tokenizer):
    text = completion(byte_tokenizer, stop=["b"], max_tokens=2)
    chunks = feed(text, byte_tokenizer, "ab", finish_reason="length")
    assert (chunks[-1].finish_reason, chunks[-1].stop_reason, text.text) == ("stop", "b", "a")
