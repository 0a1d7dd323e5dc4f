"""How big a KV pool a replica on a GPU gets, as vLLM sizes it.

    KV pool bytes = total GPU memory * gpu_memory_utilization - peak of a profile run
                    (held to the memory free after it, which other processes may have taken)

The profile run is the largest step the scheduler can make: `max_num_batched_tokens` prompt
tokens in `max_num_seqs` sequences at most, with logits for each sequence, against a KV pool
just big enough for it. Its peak, as torch's allocator counts it, covers the weights and what
activations take on top of them. Memory outside torch's allocator (the CUDA context, Triton's
modules) comes on top of the fraction. On CPU the pool is sized by `kv_cache_memory_bytes` instead.
"""
from __future__ import annotations

import torch

from pdserve.engine.attention_metadata import AttentionMetadata
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.engine.model import CausalLM


def kv_pool_bytes(total_bytes: int, gpu_memory_utilization: float, peak_bytes: int, free_bytes: int) -> int:
    """What the pool may take: the replica's share of the GPU less its profiled peak, and no more
    than is free."""
    return max(0, min(int(total_bytes * gpu_memory_utilization) - peak_bytes, free_bytes))


def profiled_kv_pool_bytes(model: CausalLM, kv_spec: KVCacheSpec, max_num_batched_tokens: int, max_num_seqs: int,
                           gpu_memory_utilization: float, device: torch.device) -> int:
    """Runs the profile step on `device` (CUDA) and returns the pool's size in bytes."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    profile_step(model, kv_spec, max_num_batched_tokens, max_num_seqs, device)
    torch.cuda.synchronize(device)
    peak_bytes = torch.cuda.max_memory_allocated(device)
    torch.cuda.empty_cache()
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    return kv_pool_bytes(total_bytes, gpu_memory_utilization, peak_bytes, free_bytes)


@torch.inference_mode()
def profile_step(model: CausalLM, kv_spec: KVCacheSpec, num_tokens: int, max_num_seqs: int,
                 device: torch.device) -> torch.Tensor:
    """One forward pass of `num_tokens` prompt tokens split over min(max_num_seqs, num_tokens)
    sequences, and their logits; returns the logits [num_seqs, vocab_size]."""
    num_seqs = min(max_num_seqs, num_tokens)
    seq_lens = [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]
    block_size = kv_spec.block_size
    blocks_per_seq = -(-max(seq_lens) // block_size)
    kv_cache = kv_spec.allocate(num_seqs * blocks_per_seq, device)
    block_tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32, device=device).view(num_seqs, -1)
    positions = torch.cat([torch.arange(n, device=device) for n in seq_lens])  # [num_tokens]
    seq_ids = torch.repeat_interleave(torch.arange(num_seqs, device=device),
                                      torch.tensor(seq_lens, device=device))  # [num_tokens]
    slots = block_tables[seq_ids, positions // block_size].long() * block_size + positions % block_size
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    attn = AttentionMetadata(
        slot_mapping=slots, num_decode_tokens=0,
        decode_block_tables=torch.empty(0, blocks_per_seq, dtype=torch.int32, device=device),
        decode_context_lens=torch.empty(0, dtype=torch.int32, device=device),
        prefill_block_tables=block_tables,
        prefill_query_start_loc=torch.cat([lens.new_zeros(1), lens.cumsum(0, dtype=torch.int32)]),
        prefill_context_lens=lens)
    input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    hidden = model(input_ids, positions, kv_cache, attn)  # [num_tokens, hidden]
    return model.compute_logits(hidden[attn.prefill_query_start_loc[1:].long() - 1])
