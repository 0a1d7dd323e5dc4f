"""The eos id read from a folder's files equals the loaded tokenizer's: read directly where
transformers reads the files the same way (the tokenizer is never loaded then), through the
tokenizer where a legacy file or an unknown token could make them differ."""
import json
import shutil

import pytest

from pdserve.checkpoints.tiny.model import ARCHITECTURE_NAMES
from pdserve.protocol import eos_token
from pdserve.protocol.eos_token import eos_token_id
from pdserve.protocol.tokenizer import load_tokenizer


def refuse_to_load(model_dir):
    raise AssertionError(f"{model_dir}: the tokenizer was loaded")


@pytest.fixture
def folder(tiny_model, tmp_path):
    """A copy of the tiny llama folder and a writer of its tokenizer_config.json."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model(arch="llama", num_layers=1), model_dir)
    config_path = model_dir / "tokenizer_config.json"

    def with_config(**changes):
        config = json.loads(config_path.read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        config_path.write_text(json.dumps(config))
        return model_dir

    return with_config


@pytest.mark.parametrize("arch", sorted(ARCHITECTURE_NAMES))
def test_a_saved_tokenizer_is_read_without_loading_it(arch, tiny_model, monkeypatch):
    model_dir = tiny_model(arch=arch, num_layers=1)
    expected = load_tokenizer(model_dir).eos_token_id
    monkeypatch.setattr(eos_token, "load_tokenizer", refuse_to_load)
    assert eos_token_id(model_dir) == expected is not None


def test_an_added_token_and_a_config_that_lists_its_added_tokens_are_read_without_loading(folder, monkeypatch):
    """A config with `added_tokens_decoder` outranks special_tokens_map.json."""
    model_dir = folder(eos_token={"content": "<|im_end|>", "special": True, "__type": "AddedToken"})
    expected = load_tokenizer(model_dir).eos_token_id
    im_end = {"content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False,
              "single_word": False, "special": True}
    folder(added_tokens_decoder={str(expected): im_end})
    (model_dir / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_start|>"}))
    assert load_tokenizer(model_dir).eos_token_id == expected
    monkeypatch.setattr(eos_token, "load_tokenizer", refuse_to_load)
    assert eos_token_id(model_dir) == expected


@pytest.mark.parametrize("case", ["legacy special_tokens_map", "token outside the vocabulary", "no eos_token"])
def test_other_folders_give_what_the_tokenizer_gives(case, folder):
    if case == "legacy special_tokens_map":  # outranks a config without added_tokens_decoder
        model_dir = folder()
        (model_dir / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_start|>"}))
        assert eos_token_id(model_dir) == load_tokenizer(model_dir).convert_tokens_to_ids("<|im_start|>")
    elif case == "token outside the vocabulary":
        model_dir = folder(eos_token="<never_seen>")
    else:
        model_dir = folder(eos_token=None)
    assert eos_token_id(model_dir) == load_tokenizer(model_dir).eos_token_id
