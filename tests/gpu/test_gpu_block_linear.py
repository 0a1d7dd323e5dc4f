"""On a GPU, a BlockLinear multiplies through the Triton kernel whatever its number of rows, and
dequantizes with it: what nn.Linear computes with the weight dequantized to bfloat16 (the tensor
cores' operand for bfloat16 x) and the same bias, the dequantized weight bit for bit."""
import pytest
import torch
import torch.nn.functional as F

from pdserve.engine.block_linear import BlockLinear
from pdserve.kernels.block_quant_reference import dequantize_reference
from tests.engine.test_block_linear import quantized

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("block_type", ["q8_0", "q4_0", "q4_1"])
def test_a_block_linear_on_cuda_equals_linear_with_the_dequantized_weight(block_type):
    blocks = quantized(40, 96, block_type)
    bias = torch.randn(40).bfloat16()
    layer = BlockLinear(blocks.cuda(), block_type, 96, bias.cuda())
    weight = dequantize_reference(blocks, block_type).bfloat16()
    for num_rows in (1, 17, 70):
        x = torch.randn(num_rows, 96).bfloat16()
        out = layer(x.cuda())
        assert out.is_cuda and out.dtype == torch.bfloat16 and out.shape == (num_rows, 40)
        expected = F.linear(x.float(), weight.float(), bias.float())
        torch.testing.assert_close(out.float().cpu(), expected, atol=3e-2, rtol=3e-2)
    assert torch.equal(layer.dequantized(torch.bfloat16).cpu(), weight)
