"""A BlockLinear computes what nn.Linear computes with the dequantized weight, whether its rows go
through the block kernel (a few) or the dequantized GEMM (many), with and without a bias, for the
32-weight block types and the K-quants (super-blocks of 256, random bytes: gguf cannot quantize
them); and serve_blocks_as_stored replaces exactly the layers whose checkpoint parts are all blocks
of one type, its blocks on the replaced layer's device. With int8 activations, a Q4 layer packed
for the int8 kernel computes that kernel's reference up to its rows (with int8 prefill, any number
where it has strips and the machine no AMX) and the dequantized weight's product beyond them; Q8_0 layers and
blocks a tied head shares stay unpacked. On CUDA every row count goes through the Triton kernel:
tests/gpu/test_gpu_block_linear.py."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pdserve.engine.block_linear import MAX_BLOCK_KERNEL_ROWS, MAX_PACKED_KERNEL_ROWS, BlockLinear, serve_blocks_as_stored
from pdserve.engine.cpu_features import cpu_has_amx
from pdserve.engine.model import fuse_on_load
from pdserve.kernels import cpu_packed_q4_linear, kquant_reference
from pdserve.kernels.block_quant_reference import dequantize_reference, quantize_reference
from tests.kernels.test_kernel_cpu_kquant_linear import random_blocks

CPU = torch.device("cpu")


def quantized(out_features: int, in_features: int, block_type: str, seed: int = 0) -> torch.Tensor:
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * 0.05
    return quantize_reference(weight, block_type)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_type", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_either_path_equals_linear_with_the_dequantized_weight(dtype, block_type, with_bias):
    blocks = quantized(40, 96, block_type)
    bias = torch.randn(40, dtype=dtype) if with_bias else None
    layer = BlockLinear(blocks, block_type, 96, bias)
    weight = dequantize_reference(blocks, block_type)
    for num_rows in (1, MAX_BLOCK_KERNEL_ROWS[dtype], MAX_BLOCK_KERNEL_ROWS[dtype] + 1, 70):
        x = torch.randn(num_rows, 96).to(dtype)
        expected = F.linear(x.float(), weight, None if bias is None else bias.float())
        out = layer(x)
        assert out.dtype == dtype and out.shape == (num_rows, 40)
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_type", ["q4_k", "q6_k"])
def test_either_path_equals_linear_with_the_dequantized_k_quant_weight(dtype, block_type):
    blocks = random_blocks(40, 512, block_type, seed=0)
    bias = torch.randn(40, dtype=dtype)
    layer = BlockLinear(blocks, block_type, 512, bias)
    weight = kquant_reference.dequantize_reference(blocks, block_type)
    for num_rows in (1, MAX_BLOCK_KERNEL_ROWS[dtype], MAX_BLOCK_KERNEL_ROWS[dtype] + 1):
        x = torch.randn(num_rows, 512).to(dtype)
        expected = F.linear(x.float(), weight, bias.float())
        out = layer(x)
        assert out.dtype == dtype and out.shape == (num_rows, 40)
        scale = expected.abs().max().item()
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out.float(), expected, atol=tolerance * scale, rtol=tolerance)


def test_a_layer_never_read_is_replaced_by_blocks_on_the_device_given():
    model = nn.Module()
    with torch.device("meta"):
        model.proj = nn.Linear(64, 32, bias=False)  # its float weight was never read
    assert serve_blocks_as_stored(model, {"proj.weight": ("q8_0", quantized(32, 64, "q8_0"))}, CPU) == 1
    assert model.proj.blocks.device == CPU
    assert model.proj(torch.randn(2, 64)).shape == (2, 32)


def test_blocks_that_do_not_hold_the_in_features_are_refused():
    with pytest.raises(ValueError, match="do not hold 64 in-features"):
        BlockLinear(quantized(8, 96, "q4_1"), "q4_1", 64, None)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = nn.Linear(64, 96, bias=False)
        self.o_proj = nn.Linear(32, 64, bias=False)
        self.extra = nn.Linear(64, 64, bias=False)
        fuse_on_load(self, "qkv_proj", ("q_proj", "k_proj", "v_proj"))


def test_fused_layers_take_their_parts_blocks_stacked_and_the_rest_stay_float():
    model = nn.Module()
    model.attn = Attention()
    parts = {name: quantized(32, 64, "q4_1", seed) for seed, name in enumerate(("q_proj", "k_proj", "v_proj"))}
    blocks = {f"attn.{name}.weight": ("q4_1", values) for name, values in parts.items()}
    blocks["attn.o_proj.weight"] = ("q8_0", quantized(64, 32, "q8_0"))
    blocks["attn.extra.weight"] = ("q4_0", quantized(64, 64, "q4_0"))

    assert serve_blocks_as_stored(model, blocks, CPU) == 3
    assert torch.equal(model.attn.qkv_proj.blocks, torch.cat(list(parts.values())))
    assert model.attn.o_proj.block_type == "q8_0" and model.attn.extra.block_type == "q4_0"

    mixed = nn.Module()
    mixed.attn = Attention()
    blocks["attn.v_proj.weight"] = ("q8_0", quantized(32, 64, "q8_0"))  # one part of another type
    del blocks["attn.extra.weight"]  # no blocks at all
    assert serve_blocks_as_stored(mixed, blocks, CPU) == 1
    assert isinstance(mixed.attn.qkv_proj, nn.Linear) and isinstance(mixed.attn.extra, nn.Linear)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_type", ["q4_0", "q4_1"])
@pytest.mark.parametrize("int8_prefill", [False, True], ids=["decode", "and-prefill"])
def test_with_int8_activations_the_kernel_quantizes_x_up_to_its_rows_and_more_take_the_dequantized_weight(
        dtype, block_type, int8_prefill):
    blocks = quantized(48, 96, block_type)
    bias = torch.randn(48, dtype=dtype)
    layer = BlockLinear(blocks, block_type, 96, bias, int8_activations=True, int8_prefill=int8_prefill)
    if cpu_packed_q4_linear.load() is None:
        pytest.skip("no C compiler: nothing is packed")
    assert layer.packed and not torch.equal(layer.blocks.view(-1), blocks.view(-1))
    # a prefill's rows go to the kernel's strips where it has them and no AMX outruns them
    strips = cpu_packed_q4_linear.has_strips() and not cpu_has_amx()
    assert layer.max_kernel_rows == (math.inf if int8_prefill and strips else MAX_PACKED_KERNEL_ROWS)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    for num_rows in (1, MAX_PACKED_KERNEL_ROWS, 70):
        x = torch.randn(num_rows, 96).to(dtype)
        if num_rows <= layer.max_kernel_rows:
            expected = cpu_packed_q4_linear.reference(x, blocks, block_type).float() + bias.float()
        else:
            expected = F.linear(x.float(), dequantize_reference(blocks, block_type), bias.float())
        torch.testing.assert_close(layer(x).float(), expected, atol=tolerance, rtol=tolerance)


def test_int8_activations_pack_the_q4_layers_but_neither_q8_0_nor_blocks_a_tied_head_shares():
    model = nn.Module()
    model.attn = Attention()
    model.head = nn.Linear(64, 64, bias=False)
    parts = {name: quantized(32, 64, "q4_1", seed) for seed, name in enumerate(("q_proj", "k_proj", "v_proj"))}
    blocks = {f"attn.{name}.weight": ("q4_1", values) for name, values in parts.items()}
    blocks["attn.o_proj.weight"] = ("q8_0", quantized(64, 32, "q8_0"))
    blocks["attn.extra.weight"] = ("q4_0", quantized(64, 64, "q4_0"))
    blocks["head.weight"] = blocks["model.embed_tokens.weight"] = ("q4_0", quantized(64, 64, "q4_0", seed=9))

    assert serve_blocks_as_stored(model, blocks, CPU, int8_activations=True) == 4
    packed = cpu_packed_q4_linear.load() is not None
    assert (model.attn.qkv_proj.packed, model.attn.extra.packed) == (packed, packed)
    assert not model.attn.o_proj.packed and not model.head.packed
    assert model.head.blocks is blocks["head.weight"][1]
