"""Pure-torch paged attention: the specification every Triton kernel is tested against.

These also serve CPU inference, so they gather K/V with vectorised indexing and attend with one
masked `scaled_dot_product_attention` call per batch, in fp32, returning the input dtype.
Cache slots outside a sequence's context may hold anything (even NaN) and block-table entries
past a sequence's last block may hold anything (even -1): neither is ever read.
"""
import torch
import torch.nn.functional as F


def store_kv_reference(key, value, k_cache, v_cache, slot_mapping) -> None:
    num_kv_heads, head_dim = key.shape[1:]
    k_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = key
    v_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = value


def decode_attention_reference(query, k_cache, v_cache, block_tables, context_lens, scale):
    query_positions = (context_lens.long() - 1)[:, None]  # [num_seqs, 1]
    out = _paged_attention(
        query[:, None], k_cache, v_cache, block_tables, query_positions, context_lens, scale
    )  # [num_seqs, 1, num_heads, head_dim]
    return out[:, 0]


def prefill_attention_reference(
    query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale
):
    num_tokens = query.shape[0]
    query_starts = query_start_loc.long()
    query_lens = query_starts.diff()  # [num_seqs]
    seq_ids = torch.repeat_interleave(
        torch.arange(len(query_lens), device=query.device), query_lens
    )  # [num_tokens]
    rows = torch.arange(num_tokens, device=query.device) - query_starts[seq_ids]  # [num_tokens]
    max_query_len = int(query_lens.max())
    padded_query = query.new_zeros(len(query_lens), max_query_len, *query.shape[1:])
    padded_query[seq_ids, rows] = query  # [num_seqs, max_query_len, num_heads, head_dim]
    prefix_lens = context_lens.long() - query_lens  # [num_seqs]
    query_positions = prefix_lens[:, None] + torch.arange(max_query_len, device=query.device)
    out = _paged_attention(
        padded_query, k_cache, v_cache, block_tables, query_positions, context_lens, scale
    )  # [num_seqs, max_query_len, num_heads, head_dim]
    return out[seq_ids, rows]


def _paged_attention(query, k_cache, v_cache, block_tables, query_positions, context_lens, scale):
    """Causal attention of padded queries over each sequence's paged context.

    query: [num_seqs, num_queries, num_heads, head_dim]; query_positions: [num_seqs, num_queries]
    absolute positions. Query rows past a sequence's query length are padding; their output is junk.
    """
    context_lens = context_lens.long()
    key_positions = torch.arange(int(context_lens.max()), device=query.device)
    in_context = key_positions < context_lens[:, None]  # [num_seqs, num_key_positions]
    key = _gather_context(k_cache, block_tables, in_context, key_positions)
    value = _gather_context(v_cache, block_tables, in_context, key_positions)
    visible = (key_positions <= query_positions[..., None]) & in_context[:, None, :]
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2).float(),  # [num_seqs, num_heads, num_queries, head_dim]
        key.transpose(1, 2).float(),  # [num_seqs, num_kv_heads, num_key_positions, head_dim]
        value.transpose(1, 2).float(),
        attn_mask=visible[:, None],  # [num_seqs, 1, num_queries, num_key_positions]
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2).to(query.dtype)


def _gather_context(cache, block_tables, in_context, key_positions):
    """Dense [num_seqs, num_key_positions, num_kv_heads, head_dim] copy; zeros outside context."""
    block_size = cache.shape[1]
    block_ids = block_tables.long()[:, key_positions // block_size]  # [num_seqs, num_key_positions]
    slots = torch.where(in_context, block_ids * block_size + key_positions % block_size, 0)
    gathered = cache.flatten(0, 1)[slots]
    return torch.where(in_context[..., None, None], gathered, 0)
