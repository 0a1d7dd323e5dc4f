"""What each scheduled token's attention reads and writes, built every step.

The block tables are gathered on the device, each step, from the rows of the runner's
persistent table (engine/block_table.py), cut to the widest table among their sequences: a row's
entries past its own table hold stale block ids, never read, as no kernel reads a row past its
sequence's context length.

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
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32, contiguous
    decode_context_lens: torch.Tensor  # [num_decodes] int32, cached tokens incl. the new one
    prefill_block_tables: torch.Tensor  # [num_prefills, max_blocks] int32, contiguous
    prefill_query_start_loc: torch.Tensor  # [num_prefills + 1] int32
    prefill_context_lens: torch.Tensor  # [num_prefills] int32, cached prefix + chunk
