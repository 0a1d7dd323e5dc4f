"""An embedding table kept in its blocks looks up what `nn.Embedding` over the dequantized table
looks up, bit for bit, in each block type and dtype."""
import pytest
import torch
import torch.nn.functional as F

from pdserve.engine.block_embedding import BlockEmbedding
from pdserve.engine.block_linear import block_reference
from tests.engine.test_block_linear import quantized
from tests.kernels.test_kernel_cpu_kquant_linear import random_blocks

VOCAB_SIZE = 300


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_type", ["q8_0", "q4_0", "q4_1", "q4_k", "q6_k"])
def test_a_lookup_equals_the_dequantized_table_cast_to_the_dtype(block_type, dtype):
    hidden = 256 if block_type in ("q4_k", "q6_k") else 96
    blocks = (random_blocks(VOCAB_SIZE, hidden, block_type, seed=0) if block_type in ("q4_k", "q6_k")
              else quantized(VOCAB_SIZE, hidden, block_type))
    table = block_reference(block_type).dequantize_reference(blocks, block_type).to(dtype)
    ids = torch.tensor([0, 299, 7, 7, 150])
    looked_up = BlockEmbedding(blocks, block_type, hidden, dtype)(ids)
    assert looked_up.dtype == dtype
    assert torch.equal(looked_up, F.embedding(ids, table))


def test_blocks_of_another_width_are_refused():
    with pytest.raises(ValueError, match="do not hold rows of 64"):
        BlockEmbedding(quantized(10, 96, "q8_0"), "q8_0", 64, torch.float32)
