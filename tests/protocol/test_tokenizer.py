"""The torch-free tokenizer loader gives what transformers' `AutoTokenizer` gives for the same
folder: the same ids, the same text back, the same special tokens and chat prompt, for every
architecture (AutoTokenizer picks its tokenizer class from the folder's model type)."""
import pytest
from transformers import AutoTokenizer

from pdserve.checkpoints.tiny.model import ARCHITECTURE_NAMES
from pdserve.protocol.tokenizer import load_tokenizer

TEXTS = ["hello", " leading space", "Ünïcödé ✓ 中文 🙂", "two\nlines\ttab", "<|im_start|>user\nhi<|im_end|>", ""]


@pytest.mark.parametrize("arch", sorted(ARCHITECTURE_NAMES))
def test_loader_equals_autotokenizer(arch, tiny_model):
    model_dir = tiny_model(arch=arch, num_layers=1)
    ours, reference = load_tokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)
    for text in TEXTS:
        ids = reference.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == reference.decode(ids), text
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True), text
    # A class may add defaults of its own that the folder never declared (Qwen2's unk token
    # "<|endoftext|>" becomes a new id past the vocabulary); the folder's own ones must match.
    assert set(ours.all_special_ids) <= set(reference.all_special_ids)
    assert (ours.bos_token_id, ours.eos_token_id) == (reference.bos_token_id, reference.eos_token_id)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert (ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            == reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
