"""Packed CPU Linear layers: the same product as `nn.Linear`, for any row count, with and without
bias; a CPU model loads with every Linear packed and its tied embedding intact."""
import pytest
import torch
from torch import nn

from pdserve.engine.config import ModelConfig
from pdserve.engine.cpu_linear import PackedLinear, packs
from pdserve.engine.weights import load_model

DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not packs(torch.bfloat16, torch.device("cpu")), reason="no oneDNN bfloat16 on this CPU"))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("num_rows", [1, 7, 300])
def test_packed_linear_computes_what_linear_computes(dtype, bias, num_rows):
    torch.manual_seed(num_rows)
    linear = nn.Linear(96, 200, bias=bias, dtype=dtype).requires_grad_(False)
    x = torch.randn(num_rows, 96, dtype=dtype)
    expected = linear(x)
    out = PackedLinear(linear)(x)
    assert out.dtype == dtype and out.shape == (num_rows, 200)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)


def test_a_cpu_model_loads_packed_with_its_tied_embedding(tiny_model):
    model_dir = tiny_model(tie_word_embeddings=True)
    config = ModelConfig.from_dir(model_dir)
    model = load_model(model_dir, config, torch.float32, torch.device("cpu"))
    assert not any(isinstance(module, nn.Linear) for module in model.modules())
    assert isinstance(model.lm_head, PackedLinear) and isinstance(model.model.layers[0].self_attn.qkv_proj, PackedLinear)
    assert model.model.embed_tokens.weight.shape == (config.vocab_size, config.hidden_size)
