import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast


@pytest.fixture(scope="session")
def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte, plus `<eos>` (id 0): the text of a token sequence is easy to predict."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + 1, initial_alphabet=alphabet,
                                  special_tokens=["<eos>"], show_progress=False)
    tokenizer.train_from_iterator(["a"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", clean_up_tokenization_spaces=False)
