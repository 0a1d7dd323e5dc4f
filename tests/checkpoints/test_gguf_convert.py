"""A .gguf file becomes an HF folder that is what transformers makes of the same file: the same
float32 weights bit for bit, the same config, the same token ids, the same greedy tokens; and for
an unquantized file, the very folder it was written from."""
import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file
from transformers import PreTrainedTokenizerFast

from pdserve.checkpoints.gguf_convert import BLOCKS_FILE_NAME, ensure_converted, file_sha256, folder_name
from pdserve.checkpoints.gguf_file import GGUFFile
from pdserve.checkpoints.gguf_weights import hf_name
from pdserve.engine.block_embedding import EMBEDDINGS, BlockEmbedding
from pdserve.engine.block_linear import BlockLinear
from pdserve.kernels import block_quant_reference, kquant_reference
from pdserve.engine.config import ModelConfig
from pdserve.engine.llm import LLM
from pdserve.engine import weights
from pdserve.protocol.eos_token import eos_token_id
from pdserve.protocol.sampling_params import SamplingParams
from tests.checkpoints.conftest import GGUF_VARIANTS
from tests.checkpoints.tokenizer_texts import CHAT, TEXTS
from tests.helpers import ENGINE_OPTIONS

CPU = torch.device("cpu")


@pytest.mark.parametrize("variant", sorted(GGUF_VARIANTS))
def test_weights_equal_transformers_gguf_loading_bit_for_bit(variant, gguf_file, converted, transformers_gguf):
    model, _ = transformers_gguf(gguf_file(variant))
    expected = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    weights = load_file(converted(variant) / "model.safetensors")
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    assert sorted(weights) == sorted(expected)
    assert model.dtype == torch.float32
    for name, values in weights.items():
        assert values.dtype == np.float32 and np.array_equal(values, expected[name]), name


@pytest.mark.parametrize("variant", sorted(GGUF_VARIANTS))
def test_the_engine_reads_the_config_transformers_builds(variant, gguf_file, converted, transformers_gguf):
    model, _ = transformers_gguf(gguf_file(variant))
    theirs = ModelConfig.from_dict({**model.config.to_dict(), "architectures": [type(model).__name__]})
    assert ModelConfig.from_dir(converted(variant)) == theirs
    assert json.loads((converted(variant) / "config.json").read_text())["dtype"] == "float32" == theirs.torch_dtype


def test_an_unquantized_file_converts_back_into_the_folder_it_was_written_from(tiny_model, converted):
    original_dir = tiny_model()
    original = load_file(f"{original_dir}/model.safetensors")
    weights = load_file(converted("f32") / "model.safetensors")
    assert sorted(weights) == sorted(original)
    for name in original:  # q/k rows are back in HF's order: llama.cpp's permutation is undone
        assert np.array_equal(weights[name], original[name]), name
    mine = PreTrainedTokenizerFast.from_pretrained(converted("f32"))
    theirs = PreTrainedTokenizerFast.from_pretrained(original_dir)
    assert [mine(text).input_ids for text in TEXTS] == [theirs(text).input_ids for text in TEXTS]


@pytest.mark.parametrize("variant", ["mixed", "tied-q8_0", "qwen2"])
def test_tokenizer_and_chat_template_equal_transformers(variant, gguf_file, converted, transformers_gguf):
    _, theirs = transformers_gguf(gguf_file(variant))
    mine = PreTrainedTokenizerFast.from_pretrained(converted(variant))
    for text in TEXTS:
        assert mine(text).input_ids == theirs(text).input_ids, text
        assert mine.decode(mine(text).input_ids) == theirs.decode(theirs(text).input_ids), text
    assert (mine.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
            == theirs.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False))
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(mine, name) == getattr(theirs, name), name
    assert eos_token_id(converted(variant)) == mine.eos_token_id


def dequantize_reference(blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    reference = kquant_reference if block_type in kquant_reference.K_BLOCK_TYPES else block_quant_reference
    return reference.dequantize_reference(blocks, block_type)


@pytest.mark.parametrize("variant", ["mixed", "tied-q8_0", "qwen2", "f16", "q4_k_m"])
def test_the_block_matrices_are_kept_as_stored_and_widen_to_the_float_weights(variant, gguf_file, converted):
    gguf = GGUFFile(gguf_file(variant))
    stored = {hf_name(name): gguf.block_type(name) for name in gguf.tensor_names if gguf.block_type(name)}
    weights = load_file(converted(variant) / "model.safetensors")
    with safe_open(converted(variant) / BLOCKS_FILE_NAME, framework="pt") as blocks:
        metadata = blocks.metadata()
        assert metadata.pop("format") == "gguf-blocks"
        assert metadata == stored and sorted(blocks.keys()) == sorted(stored)
        for name in blocks.keys():  # rows in HF's order, as the float weights: q/k unpermuted too
            widened = dequantize_reference(blocks.get_tensor(name), metadata[name]).numpy()
            assert np.array_equal(widened, weights[name]), name
    assert variant != "mixed" or set(stored.values()) == {"q8_0", "q4_0", "q4_1", "q4_k", "q6_k"}  # not q5_k


def test_the_engine_multiplies_the_matrices_of_one_block_type_as_stored(converted):
    stored, dequantized = (LLM(str(converted("tied-q8_0")), quantized_weights=mode, **ENGINE_OPTIONS).engine
                           for mode in ("as-stored", "dequantized"))
    model = stored.runner.model
    served = {name: module for name, module in model.named_modules() if isinstance(module, BlockLinear)}
    layers = {f"model.layers.{i}.{part}" for i in range(model.config.num_layers)
              for part in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
    assert set(served) == layers | {"lm_head"}  # the tied head multiplies the embeddings' Q8_0 blocks
    embeddings = model.model.embed_tokens
    assert isinstance(embeddings, BlockEmbedding) and embeddings.blocks is model.lm_head.blocks  # looked up in them
    assert not any(isinstance(module, (BlockLinear, BlockEmbedding)) for module in dequantized.runner.model.modules())
    # Each served layer holds its blocks in place of its float32 weight (the head in place of its
    # packed copy), the embeddings no table beside the head's blocks, and nothing else changes.
    saved = sum(layer.out_features * layer.in_features * 4 - layer.blocks.numel() for layer in served.values())
    float_table = model.config.vocab_size * model.config.hidden_size * 4
    assert dequantized.weights_bytes - stored.weights_bytes == saved + float_table > float_table
    assert stored.load()["weights_bytes"] == stored.weights_bytes


def test_layers_whose_parts_differ_in_block_type_keep_float_weights(converted):
    model = LLM(str(converted("mixed")), quantized_weights="as-stored", **ENGINE_OPTIONS).engine.runner.model
    layers = dict(model.named_modules())
    assert not isinstance(layers["model.layers.0.self_attn.qkv_proj"], BlockLinear)  # q4_0, q4_1, q8_0
    assert not isinstance(layers["model.layers.0.mlp.gate_up_proj"], BlockLinear)  # q4_k, q5_k
    assert isinstance(layers["model.layers.1.mlp.gate_up_proj"], BlockLinear)  # q4_1 both
    assert layers["model.layers.0.mlp.down_proj"].block_type == "q6_k"
    assert layers["lm_head"].block_type == "q6_k"


def names_served_by_blocks(model: torch.nn.Module) -> set[str]:
    """The checkpoint names of the weights that `model`'s BlockLinear layers and BlockEmbedding
    stand for (a fused layer stands for all its parts)."""
    names = {EMBEDDINGS} if isinstance(model.model.embed_tokens, BlockEmbedding) else set()
    for path, module in model.named_modules():
        parts_of = getattr(module, "checkpoint_parts", {})
        for attr, child in module.named_children():
            if isinstance(child, BlockLinear):
                names |= {f"{path}.{part}.weight" if path else f"{part}.weight" for part in parts_of.get(attr, (attr,))}
    return names


@pytest.mark.parametrize("variant", ["mixed", "tied-q8_0"])
def test_loading_as_stored_reads_every_float_weight_but_those_blocks_serve(variant, converted, monkeypatch):
    folder = converted(variant)
    read = []

    class RecordingFile:
        def __init__(self, path, handle):
            self._path, self._handle = Path(path), handle

        def __getattr__(self, name):
            return getattr(self._handle, name)

        def get_tensor(self, name):
            read.append((self._path.name, name))
            return self._handle.get_tensor(name)

    @contextlib.contextmanager
    def recording_safe_open(path, framework):
        with safe_open(path, framework=framework) as handle:
            yield RecordingFile(path, handle)

    monkeypatch.setattr(weights, "safe_open", recording_safe_open)
    model = weights.load_model(folder, ModelConfig.from_dir(folder), torch.float32, CPU, quantized_weights="as-stored")
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        float_names = set(f.keys())
    served = names_served_by_blocks(model)
    assert served and served < float_names
    assert {name for file, name in read if file == "model.safetensors"} == float_names - served


def test_the_k_quant_matrices_of_a_q4_k_m_file_are_multiplied_as_stored(converted):
    """Q4_K and Q6_K are kept as stored (Q5_K, rarer, is only ever dequantized)."""
    model = LLM(str(converted("q4_k_m")), quantized_weights="as-stored", **ENGINE_OPTIONS).engine.runner.model
    served = {name: module.block_type for name, module in model.named_modules() if isinstance(module, BlockLinear)}
    assert served["lm_head"] == "q6_k"
    for i in range(model.config.num_layers):
        assert served[f"model.layers.{i}.mlp.down_proj"] == "q6_k"
        for part in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"):
            assert served[f"model.layers.{i}.{part}"] == "q4_k"


def test_generation_config_ends_at_the_end_of_text_and_the_chat_turns_end(converted):
    generation = json.loads((converted("mixed") / "generation_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast.from_pretrained(converted("mixed"))
    assert generation["eos_token_id"] == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.parametrize("quantized_weights", ["dequantized", "as-stored"])
@pytest.mark.parametrize("variant", ["mixed", "qwen2", "q4_k_m"])
def test_greedy_tokens_of_the_engine_equal_transformers_on_the_quantized_file(variant, quantized_weights, gguf_file,
                                                                              converted, transformers_gguf):
    model, _ = transformers_gguf(gguf_file(variant))
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, model.config.vocab_size, (length,), generator=generator).tolist()
               for length in (1, 9, 64)]
    max_tokens = 10
    outputs = LLM(str(converted(variant)), quantized_weights=quantized_weights, **ENGINE_OPTIONS).generate(
        prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        ids = torch.tensor([prompt])
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert list(output.outputs[0].token_ids) == expected


def test_a_file_is_converted_once_into_a_folder_named_by_its_content(gguf_file, tmp_path, monkeypatch):
    from pdserve.checkpoints import gguf_convert

    path = gguf_file("mixed")
    model_dir = ensure_converted(path, tmp_path)
    assert model_dir.parent == tmp_path / "checkpoints"
    assert model_dir.name == folder_name("tiny-mixed", file_sha256(path))
    assert [entry.name for entry in model_dir.parent.iterdir()] == [model_dir.name]  # no staging folder left

    def no_second_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "convert_gguf", no_second_conversion)
    assert ensure_converted(path, tmp_path) == model_dir
    other = tmp_path / "tiny-mixed.gguf"
    other.write_bytes(gguf_file("f16").read_bytes())  # same name, other content: another folder
    with pytest.raises(AssertionError, match="converted again"):
        ensure_converted(other, tmp_path)
