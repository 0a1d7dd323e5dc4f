"""A .gguf file this converter cannot serve faithfully is refused with a GGUFError that names the
file and what is wrong, leaves nothing in the cache, and reaches a user of the command line as one
line and exit status 2, never a traceback."""
import os
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as Q

from pdserve.checkpoints.errors import GGUFError
from pdserve.checkpoints.gguf_convert import convert_gguf, ensure_converted
from tests.checkpoints.gguf_files import write_gguf

BAD_FILES = {
    # name: (write_gguf keywords, or "model": the tiny model's spec; what the message must say)
    "q5_0": ({"types": {"blk.1.ffn_up.weight": Q.Q5_0}}, "blk.1.ffn_up.weight is Q5_0, which is not supported"),
    "no-tokenizer": ({"drop": ("tokenizer.ggml.tokens",)}, "no 'tokenizer.ggml.tokens' in its metadata"),
    "sentencepiece": ({"metadata": {"tokenizer.ggml.model": "llama"}}, "tokenizer.ggml.model is 'llama'"),
    "chatglm-split": ({"metadata": {"tokenizer.ggml.pre": "chatglm-bpe"}}, "tokenizer.ggml.pre is 'chatglm-bpe'"),
    "gemma2": ({"arch": "gemma2"}, "general.architecture is 'gemma2'; supported for .gguf files: llama, qwen2"),
    "rope-scaling": ({"metadata": {"llama.rope.scaling.type": "linear"}}, "RoPE scaling (linear) is not supported"),
    "missing-tensor": ({"drop": ("blk.2.ffn_up.weight",)}, "missing tensors for model.layers.2.mlp.up_proj.weight"),
    "llama-with-biases": ({"model": {"arch": "qwen2"}, "arch": "llama"},
                          "unexpected tensors for model.layers.0.self_attn.k_proj.bias"),
    "partial-rotary": ({"metadata": {"llama.rope.dimension_count": 16}}, "rotary embeddings on 16 of 32 head dims"),
}


@pytest.fixture(scope="module")
def valid_gguf(tiny_model, tmp_path_factory):
    return write_gguf(tiny_model(), tmp_path_factory.mktemp("valid") / "valid.gguf")


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_an_unsupported_file_is_refused_naming_what_is_wrong(name, tiny_model, tmp_path):
    keywords, message = BAD_FILES[name]
    spec = keywords.get("model", {})
    path = write_gguf(tiny_model(**spec), tmp_path / f"{name}.gguf",
                      **{key: value for key, value in keywords.items() if key != "model"})
    with pytest.raises(GGUFError, match=f"^{path}: ") as raised:
        ensure_converted(path, tmp_path / "cache")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert list((tmp_path / "cache" / "checkpoints").iterdir()) == []  # no folder, no staging left


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text('{"not": "gguf"}')
    with pytest.raises(GGUFError, match="not a GGUF file"):
        convert_gguf(path, tmp_path)


@pytest.mark.parametrize("fraction", [0.001, 0.5, 0.999])
def test_a_truncated_file_is_refused(fraction, valid_gguf, tmp_path):
    data = valid_gguf.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:int(len(data) * fraction)])
    with pytest.raises(GGUFError, match="truncated"):
        convert_gguf(path, tmp_path)


def test_the_command_line_prints_one_line_and_exits_2(valid_gguf, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(valid_gguf.read_bytes()[:100_000])
    fetched = subprocess.run([sys.executable, "-m", "pdserve", "model", "fetch", str(path)], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert fetched.returncode == 2
    assert fetched.stderr.splitlines()[-1].startswith(f"pdserve: {path}: truncated or corrupt GGUF file")
    assert "Traceback" not in fetched.stderr
    assert fetched.stdout == ""
