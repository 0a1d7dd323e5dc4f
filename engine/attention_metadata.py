"""What each scheduled token's attention reads and writes, rebuilt every step.

A step's tokens are packed as `[decode tokens | prefill tokens]`: the first `num_decode_tokens`
belong to sequences that add exactly one token (one query row per sequence, the decode kernel);
the rest are prompt chunks of the remaining sequences, back to back (the prefill kernel, causal
over the chunk, attending to the sequence's cached prefix).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, flat KV slot of each token
    num_decode_tokens: int
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32
    decode_context_lens: torch.Tensor  # [num_decodes] int32, cached tokens incl. the new one
    prefill_block_tables: torch.Tensor  # [num_prefills, max_blocks] int32
    prefill_query_start_loc: torch.Tensor  # [num_prefills + 1] int32
    prefill_context_lens: torch.Tensor  # [num_prefills] int32, cached prefix + chunk
