"""`quantization` on a folder converted from a GGUF: with `quantized_weights="as-stored"` the layers
the file holds in Q8_0/Q4_0/Q4_1/Q4_K/Q6_K blocks keep them (quantizing them again would only add
error) and the others (Q5_K, floats, parts of mixed types) are quantized from their floats; with
"dequantized" the floats are the checkpoint and every layer is quantized from them."""
import torch
from safetensors import safe_open

from pdserve.checkpoints.gguf_convert import BLOCKS_FILE_NAME
from pdserve.engine.block_linear import BlockLinear
from pdserve.engine.config import ModelConfig
from pdserve.engine.weights import load_model


def block_types(model) -> dict[str, str]:
    return {name: layer.block_type for name, layer in model.named_modules() if isinstance(layer, BlockLinear)}


def test_layers_stored_in_blocks_keep_them_and_the_rest_are_quantized(converted):
    model_dir = converted("mixed")  # the layers' matrices q4_1 unless named in MIXED_TYPES
    config = ModelConfig.from_dir(model_dir)
    stored, dequantized = (
        load_model(model_dir, config, torch.float32, torch.device("cpu"), quantized_weights=mode, quantization="int8")
        for mode in ("as-stored", "dequantized"))
    kept = block_types(stored)
    assert kept["model.layers.1.mlp.gate_up_proj"] == "q4_1"  # stored q4_1, both parts
    assert kept["model.layers.0.self_attn.qkv_proj"] == "q8_0"  # parts q4_0, q4_1, q8_0
    assert kept["model.layers.0.mlp.gate_up_proj"] == "q8_0"  # q4_k, q5_k
    assert kept["lm_head"] == "q6_k"  # stored q6_k
    assert kept["model.layers.0.mlp.down_proj"] == "q6_k"
    with safe_open(model_dir / BLOCKS_FILE_NAME, framework="pt") as blocks:
        gate, up = (blocks.get_tensor(f"model.layers.1.mlp.{part}.weight") for part in ("gate_proj", "up_proj"))
    assert torch.equal(stored.model.layers[1].mlp.gate_up_proj.blocks, torch.cat([gate, up]))
    assert set(block_types(dequantized)) == set(kept) and set(block_types(dequantized).values()) == {"q8_0"}
