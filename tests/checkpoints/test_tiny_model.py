"""`make-tiny-model` writes folders transformers loads, deterministically, with a useful model.

A model counts as useful when greedy decoding keeps producing new tokens: engine-versus-
transformers equality on a model that repeats one token would prove little.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from pdserve.checkpoints.tiny.model import ARCHITECTURE_NAMES, TinyModelSpec, write_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL_SHAPES = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    intermediate_size=128, vocab_size=512)
PROMPTS = ("def main(argv):", "The quick brown fox", "import torch\n", "你好, world 😀")
NUM_NEW_TOKENS = 24
# With two layers the least varied prompt gives 23-24 distinct tokens of 24 at init_range 0.2,
# and 5-9 at 0.02.
MIN_DISTINCT_NEW_TOKENS = 16


def min_distinct_greedy_tokens(model_dir: Path) -> int:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    num_distinct = []
    for prompt in PROMPTS:
        prompt_ids = tokenizer(prompt, return_tensors="pt").input_ids  # [1, num_prompt_tokens]
        output_ids = model.generate(prompt_ids, do_sample=False, max_new_tokens=NUM_NEW_TOKENS,
                                    min_new_tokens=NUM_NEW_TOKENS)  # [1, num_prompt + new]
        num_distinct.append(len(set(output_ids[0, prompt_ids.shape[1]:].tolist())))
    return min(num_distinct)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Default shapes but two layers, one folder per arch."""
    return {arch: write_tiny_model(tmp_path_factory.mktemp(arch), arch=arch, num_layers=2)
            for arch in ARCHITECTURE_NAMES}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURE_NAMES))
def test_each_arch_loads_in_transformers_and_greedy_output_varies(arch, model_dirs):
    assert AutoConfig.from_pretrained(model_dirs[arch]).architectures == [ARCHITECTURE_NAMES[arch]]
    assert min_distinct_greedy_tokens(model_dirs[arch]) >= MIN_DISTINCT_NEW_TOKENS


def test_the_usual_small_init_range_would_make_greedy_output_repeat(tmp_path):
    model_dir = write_tiny_model(tmp_path, num_layers=2, init_range=0.02)
    assert min_distinct_greedy_tokens(model_dir) < MIN_DISTINCT_NEW_TOKENS


def test_same_arguments_give_byte_identical_folder_and_another_seed_other_weights(tmp_path):
    first = write_tiny_model(tmp_path / "first", seed=7, **SMALL_SHAPES)
    again = write_tiny_model(tmp_path / "again", seed=7, **SMALL_SHAPES)
    other = write_tiny_model(tmp_path / "other", seed=8, **SMALL_SHAPES)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_weights_are_drawn_at_init_range_and_norms_scatter_around_one(model_dirs):
    with safe_open(model_dirs["qwen2"] / "model.safetensors", framework="pt") as weights:
        embed = weights.get_tensor("model.embed_tokens.weight")
        q_bias = weights.get_tensor("model.layers.0.self_attn.q_proj.bias")
        norm = weights.get_tensor("model.layers.0.input_layernorm.weight")
    assert embed.std().item() == pytest.approx(0.2, rel=0.05)
    assert q_bias.abs().max().item() > 0.0
    assert norm.mean().item() == pytest.approx(1.0, abs=0.1)
    assert not torch.equal(norm, torch.ones_like(norm))


def test_tied_embeddings_save_no_lm_head_and_load_tied(tmp_path):
    model_dir = write_tiny_model(tmp_path, tie_word_embeddings=True, dtype="bfloat16", **SMALL_SHAPES)
    with safe_open(model_dir / "model.safetensors", framework="pt") as weights:
        assert "lm_head.weight" not in weights.keys()
        assert weights.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_qwen2_has_qkv_bias_and_neither_qwen2_nor_mistral_a_sliding_window(model_dirs):
    qwen2 = json.loads((model_dirs["qwen2"] / "config.json").read_text())
    mistral = json.loads((model_dirs["mistral"] / "config.json").read_text())
    assert qwen2["use_sliding_window"] is False and qwen2["sliding_window"] is None
    assert mistral["sliding_window"] is None
    with safe_open(model_dirs["qwen2"] / "model.safetensors", framework="pt") as weights:
        assert {"k_proj", "q_proj", "v_proj"} == {
            name.split(".")[-2] for name in weights.keys() if name.endswith("_proj.bias")}


def test_llama3_rope_scaling_is_written_and_loads(tmp_path):
    model_dir = write_tiny_model(tmp_path, rope_scaling="llama3", max_position_embeddings=1024,
                                 **SMALL_SHAPES)
    rope = AutoConfig.from_pretrained(model_dir).rope_parameters
    assert rope["rope_type"] == "llama3"
    assert (rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]) == (8.0, 1.0, 4.0)
    assert rope["original_max_position_embeddings"] == 256
    inv_freq = AutoModelForCausalLM.from_pretrained(model_dir).model.rotary_emb.inv_freq  # [head_dim / 2]
    head_dim = SMALL_SHAPES["hidden_size"] // SMALL_SHAPES["num_heads"]
    plain_inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, head_dim, 2) / head_dim)
    assert inv_freq[0] == pytest.approx(plain_inv_freq[0].item())
    assert inv_freq[-1] == pytest.approx(plain_inv_freq[-1].item() / 8.0)


def test_tokenizer_round_trips_any_utf8_and_matches_config_vocab(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["llama"])
    config = AutoConfig.from_pretrained(model_dirs["llama"])
    assert len(tokenizer) == config.vocab_size == 4096
    text = "naïve café — 你好，世界 🙂🚀 \t\n  trailing  "
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)


def test_encoding_adds_one_bos_and_the_chat_template_holds_exactly_one(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["llama"])
    assert tokenizer("hello").input_ids[0] == tokenizer.bos_token_id
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 👋"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi 👋<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True).input_ids
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


@pytest.mark.parametrize("fields", [dict(num_heads=6), dict(num_kv_heads=3), dict(vocab_size=100),
                                    dict(arch="gpt2"), dict(head_dim=7), dict(rope_scaling="yarn")])
def test_inconsistent_specs_are_refused(fields):
    with pytest.raises(ValueError):
        TinyModelSpec(**fields)


def test_cli_writes_a_folder_transformers_loads(tmp_path):
    model_dir = tmp_path / "cli"
    environment = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "pdserve", "make-tiny-model", str(model_dir), "--arch", "qwen2",
         "--hidden-size", "64", "--num-layers", "2", "--num-heads", "8", "--num-kv-heads", "2",
         "--head-dim", "16", "--intermediate-size", "96", "--vocab-size", "512",
         "--seed", "3", "--init-range", "0.1", "--dtype", "float16", "--tie-word-embeddings"],
        capture_output=True, text=True, env=environment, check=True,
    )
    assert result.stdout.strip() == str(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    assert (config.model_type, config.num_key_value_heads, config.head_dim) == ("qwen2", 2, 16)
    assert (config.tie_word_embeddings, config.dtype) == (True, torch.float16)
    assert config.initializer_range == 0.1
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (8 * 16, 64)


def test_generation_config_ends_on_end_of_text_and_end_of_turn(tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    model_dir = write_tiny_model(tmp_path / "m", vocab_size=512, hidden_size=64, num_layers=1, num_heads=2,
                                 num_kv_heads=1, intermediate_size=128)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos_ids = GenerationConfig.from_pretrained(model_dir).eos_token_id
    assert eos_ids == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
