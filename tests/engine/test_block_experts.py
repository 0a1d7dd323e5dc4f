"""`quantization="int8"|"int4"` on a mixture of experts: each expert's gate_up and down become
BlockLinears over the blocks of its checkpoint weights as stored (engine/block_experts.py), the
router stays float, and a layer whose sizes are not multiples of 32 keeps its experts float.

The oracle is the engine itself in float32 on a copy of the checkpoint whose quantized weights are
replaced by their dequantized blocks: what the blocks compute, up to summation order, so greedy
tokens are equal (a wrong gate/up order or expert order would scramble them).
"""
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pdserve.engine.block_experts import BlockExperts
from pdserve.engine.block_linear import BlockLinear
from pdserve.engine.config import ModelConfig
from pdserve.engine.llm import LLM
from pdserve.engine.model import CausalLM
from pdserve.engine.moe import Experts
from pdserve.engine.quantize_at_load import BLOCK_TYPES, HEAD_BLOCK_TYPE, head_weight_names, weight_names_to_quantize
from pdserve.engine.weights import load_model
from pdserve.kernels.block_quant_reference import dequantize_reference, quantize_reference
from pdserve.protocol.sampling_params import SamplingParams
from tests.family_configs import VOCAB_SIZE, mixtral_config, qwen3_moe_config
from tests.helpers import ENGINE_OPTIONS

CPU = torch.device("cpu")


def load(model_dir: str, quantization: str | None):
    return load_model(model_dir, ModelConfig.from_dir(model_dir), torch.float32, CPU, quantization=quantization)


def renamed(name: str, model_dir: str) -> str:
    for pattern, replacement in ModelConfig.from_dir(model_dir).checkpoint.renames:
        name = re.sub(pattern, replacement, name)
    return name


@pytest.mark.parametrize("quantization", sorted(BLOCK_TYPES))
def test_each_expert_holds_the_blocks_of_its_checkpoint_weights_and_the_router_stays_float(hf_model, quantization):
    model_dir = hf_model(mixtral_config())
    stored = {renamed(name, model_dir): tensor for name, tensor in load_file(f"{model_dir}/model.safetensors").items()}
    model = load(model_dir, quantization)
    block_type = BLOCK_TYPES[quantization]
    for i, layer in enumerate(model.model.layers):
        experts, prefix = layer.mlp.experts, f"model.layers.{i}.mlp.experts"
        assert isinstance(experts, BlockExperts) and not isinstance(layer.mlp.gate, BlockLinear)
        for e in range(experts.num_experts):
            gate_up, down = experts.gate_up[e], experts.down[e]
            assert (gate_up.block_type, down.block_type) == (block_type, block_type)
            parts = [stored[f"{prefix}.{e}.{part}.weight"] for part in ("gate_proj", "up_proj")]
            assert torch.equal(gate_up.blocks, torch.cat([quantize_reference(w, block_type) for w in parts]))
            assert torch.equal(down.blocks, quantize_reference(stored[f"{prefix}.{e}.down_proj.weight"], block_type))


def test_experts_whose_intermediate_size_is_not_a_multiple_of_32_stay_float(hf_model):
    model = load(hf_model(qwen3_moe_config(norm_topk_prob=True, mlp_only_layers=[1])), "int8")  # experts' 48
    assert isinstance(model.model.layers[0].mlp.experts, Experts)
    assert isinstance(model.model.layers[1].mlp.down_proj, BlockLinear)  # the dense layer's MLP is quantized


def dequantized_copy(model_dir: str, quantization: str, tmp_path) -> str:
    """The folder with every weight that `quantization` quantizes replaced by its dequantized blocks."""
    with torch.device("meta"):  # the layers as built, before a load packs them
        model = CausalLM(ModelConfig.from_dir(model_dir), CPU)
    quantized, head = weight_names_to_quantize(model), head_weight_names(model)
    copy = tmp_path / "dequantized"
    shutil.copytree(model_dir, copy)
    tensors = load_file(f"{model_dir}/model.safetensors")
    for name, tensor in tensors.items():
        if (checkpoint_name := renamed(name, model_dir)) in quantized:
            block_type = HEAD_BLOCK_TYPE if checkpoint_name in head else BLOCK_TYPES[quantization]
            tensors[name] = dequantize_reference(quantize_reference(tensor, block_type), block_type).to(tensor.dtype)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    return str(copy)


@pytest.mark.parametrize("quantization", sorted(BLOCK_TYPES))
def test_greedy_tokens_equal_the_float_engine_on_the_dequantized_blocks(hf_model, quantization, tmp_path):
    model_dir = hf_model(mixtral_config())
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB_SIZE, (length,), generator=generator).tolist() for length in (1, 9, 33, 70)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    options = {**ENGINE_OPTIONS, "dtype": "float32"}
    served = LLM(model_dir, quantization=quantization, **options).generate(prompts, params, use_tqdm=False)
    oracle = LLM(dequantized_copy(model_dir, quantization, tmp_path), **options).generate(prompts, params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in served] == [out.outputs[0].token_ids for out in oracle]
