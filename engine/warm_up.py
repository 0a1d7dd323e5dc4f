"""Launching every kernel variant serving can ask for once at start, so no request waits for
Triton's compiler (kernels/launch_variants.py says which block-table widths those are).

Each warm-up step runs the model on one decode token and one one-token prefill chunk whose
block tables are `width` blocks wide, all entries block 0, so the steps read and write only
block 0 of the pool, which no request holds yet. Run once the pool exists, before serving.

Layers on blocks as stored (engine/block_linear.py) compile a Triton variant per row tile, which
a step's rows pick (kernels/triton_block_linear.py): each such layer also runs once on the rows
of each tile, on zeros, touching nothing but its output.
"""
from __future__ import annotations

import torch

from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.block_linear import BlockLinear
from pdserve.engine.model import CausalLM


@torch.inference_mode()
def warm_up(model: CausalLM, kv_cache: torch.Tensor, block_size: int, widths: list[int], device: torch.device) -> None:
    for width in widths:
        context_len = width * block_size
        as_tensor = lambda values, dtype: torch.tensor(values, dtype=dtype, device=device)  # noqa: E731
        block_tables = torch.zeros(1, width, dtype=torch.int32, device=device)
        attn = AttentionMetadata(
            slot_mapping=as_tensor([0, 0], torch.int64), num_decode_tokens=1,
            decode_block_tables=block_tables, decode_context_lens=as_tensor([context_len], torch.int32),
            prefill_block_tables=block_tables, prefill_query_start_loc=as_tensor([0, 1], torch.int32),
            prefill_context_lens=as_tensor([context_len], torch.int32))
        positions = as_tensor([context_len - 1] * 2, torch.int64)
        hidden = model(as_tensor([0, 0], torch.int64), positions, kv_cache, attn)  # [2, hidden]
        model.compute_logits(hidden)
    _warm_up_block_linears(model, device)


def _warm_up_block_linears(model: CausalLM, device: torch.device) -> None:
    from pdserve.kernels.triton_block_linear import ROW_TILES  # imports Triton: CUDA only

    dtype = model.dtype
    for layer in model.modules():
        if isinstance(layer, BlockLinear):
            for rows in ROW_TILES:
                layer(torch.zeros(rows, layer.in_features, dtype=dtype, device=device))
