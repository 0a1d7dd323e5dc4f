"""An embedding table kept in its GGUF blocks, as stored: a lookup widens only the rows it gathers.

A tied head multiplies the same blocks (engine/block_linear.py), so a model whose embeddings are
stored in blocks holds the table once, in blocks: SmolLM2-135M's Q8_0 table takes 28 MiB, where
the bfloat16 table it replaces took 54 MiB beside it.

Invariant: a lookup equals `nn.Embedding` over the dequantized table (gguf's float32
dequantization, bit for bit) cast to the model's dtype.
"""
from __future__ import annotations

import torch
from torch import nn

from pdserve.engine.block_linear import block_reference

EMBEDDINGS = "model.embed_tokens.weight"  # the table's checkpoint name (after the family's renames)


class BlockEmbedding(nn.Module):
    def __init__(self, blocks: torch.Tensor, block_type: str, embedding_dim: int, dtype: torch.dtype):
        """blocks: uint8 [num_embeddings, row bytes], each row its blocks back to back."""
        super().__init__()
        if block_reference(block_type).in_features_of(blocks, block_type) != embedding_dim:
            raise ValueError(f"{block_type} blocks {list(blocks.shape)} do not hold rows of {embedding_dim}")
        self.block_type, self.embedding_dim, self.dtype = block_type, embedding_dim, dtype
        self.register_buffer("blocks", blocks)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [num_tokens] -> [num_tokens, embedding_dim]
        rows = self.blocks.index_select(0, input_ids)
        return block_reference(self.block_type).dequantize_reference(rows, self.block_type).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.blocks.shape[0]}, {self.embedding_dim}, block_type={self.block_type}"


def serve_embeddings_as_stored(model: nn.Module, blocks: dict[str, tuple[str, torch.Tensor]],
                               device: torch.device) -> None:
    """Replaces `model.model.embed_tokens` by a `BlockEmbedding` on `device` over its blocks in
    `blocks` (name -> (block type, uint8 blocks)), the very tensor a tied head's `BlockLinear`
    holds; nothing when they are not there. The table it replaces may be a meta tensor."""
    if EMBEDDINGS not in blocks:
        return
    block_type, table = blocks[EMBEDDINGS]
    embeddings = model.model.embed_tokens
    model.model.embed_tokens = BlockEmbedding(table.to(device), block_type, embeddings.embedding_dim,
                                              embeddings.weight.dtype)
