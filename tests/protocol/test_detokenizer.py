"""IncrementalDetokenizer: deltas add up to the full decode and never split a character."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from pdserve.protocol.detokenizer import IncrementalDetokenizer

CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好。我们一起去公园吧。",
    "Emoji time 😀🎉🚀👍🏽 and family 👨‍👩‍👧 ok",
    "naïve café, déjà vu, Größe, Ελληνικά, русский",
]
VOCAB_SIZE = 400


def build_byte_level_bpe() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 10, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<eos>", clean_up_tokenization_spaces=False
    )


TOKENIZER = build_byte_level_bpe()


def full_decode(token_ids: list[int]) -> str:
    return TOKENIZER.decode(token_ids, skip_special_tokens=True)


def stream(prompt_ids: list[int], chunks: list[list[int]]) -> list[str]:
    detokenizer = IncrementalDetokenizer(TOKENIZER, prompt_ids)
    deltas = [detokenizer.push(chunk) for chunk in chunks]
    deltas.append(detokenizer.finish())
    assert detokenizer.text == "".join(deltas)
    return deltas


token_id = st.integers(min_value=0, max_value=len(TOKENIZER) - 1)
text = st.text(alphabet="ab 你好世界😀🎉👍🏽👨‍👩‍👧éΩ\n", max_size=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt_ids=st.lists(token_id, max_size=8),
    chunks=st.lists(st.lists(token_id, min_size=1, max_size=3), max_size=25),
)
def test_deltas_of_random_ids_concatenate_to_the_full_decode(prompt_ids, chunks):
    output_ids = [i for chunk in chunks for i in chunk]
    full_text = full_decode(output_ids)
    deltas = stream(prompt_ids, chunks)
    assert "".join(deltas) == full_text
    if "\ufffd" not in full_text:
        assert not any("\ufffd" in delta for delta in deltas)


@settings(max_examples=200, deadline=None)
@given(prompt=text, completion=text)
def test_streaming_real_text_token_by_token_never_emits_a_partial_character(prompt, completion):
    output_ids = TOKENIZER.encode(completion)
    deltas = stream(TOKENIZER.encode(prompt), [[i] for i in output_ids])
    assert "".join(deltas) == completion
    assert not any("\ufffd" in delta for delta in deltas)


def test_an_emoji_split_across_tokens_is_held_back_until_complete():
    emoji_ids = TOKENIZER.encode("😀")
    assert len(emoji_ids) > 1  # the test only means something if the emoji is split
    detokenizer = IncrementalDetokenizer(TOKENIZER, TOKENIZER.encode("Hi "))
    assert [detokenizer.push([i]) for i in emoji_ids[:-1]] == [""] * (len(emoji_ids) - 1)
    assert detokenizer.push(emoji_ids[-1:]) == "😀"
    assert detokenizer.finish() == ""


def test_finish_flushes_an_incomplete_tail():
    emoji_ids = TOKENIZER.encode("😀")
    detokenizer = IncrementalDetokenizer(TOKENIZER, [])
    assert detokenizer.push(TOKENIZER.encode("ok")) == "ok"
    assert detokenizer.push(emoji_ids[:1]) == ""
    assert detokenizer.finish() == full_decode(emoji_ids[:1]) == "\ufffd"
    assert detokenizer.text == "ok\ufffd"


def test_special_tokens_are_skipped():
    ids = TOKENIZER.encode("ab") + [TOKENIZER.eos_token_id]
    assert "".join(stream([], [[i] for i in ids])) == "ab"


def test_each_step_decodes_a_short_window_not_the_whole_output():
    window_sizes = []

    class RecordingTokenizer:
        def decode(self, token_ids, **kwargs):
            window_sizes.append(len(token_ids))
            return TOKENIZER.decode(token_ids, **kwargs)

    detokenizer = IncrementalDetokenizer(RecordingTokenizer(), TOKENIZER.encode("a prompt " * 20))
    for i in TOKENIZER.encode("the quick brown fox " * 30):
        detokenizer.push([i])
    assert max(window_sizes) <= 6


def test_push_after_finish_is_an_error():
    detokenizer = IncrementalDetokenizer(TOKENIZER, [])
    detokenizer.finish()
    with pytest.raises(RuntimeError):
        detokenizer.push([1])
