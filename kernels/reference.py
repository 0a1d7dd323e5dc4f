"""Pure-torch paged attention: the specification every Triton kernel is tested against.

These also serve CPU inference, so they copy K/V out of the pool a whole block at a time and
attend with `scaled_dot_product_attention`, returning the input dtype. An int8 pool's entries
(kernels/kv_quant.py) are widened to float32 as they are copied out, and its writes quantized:
- decode, in fp32: one query row per sequence; sequences attending a similar number of keys share
  one call over their keys padded to the group's longest (padding masked), so however ragged the batch a
  call reads at most about `1 / MIN_GROUP_LENGTH_RATIO` times the keys it needs, and a call's
  copy of K stays small enough (`MAX_GROUP_KEY_BYTES`) to be still in cache when it is read;
- prefill: sequence by sequence, so memory follows each sequence's own chunk and context rather
  than the batch's longest chunk times its longest context, and within a sequence `QUERY_CHUNK`
  query rows at a time over the keys they can see (a causal prefill scores about half of the
  query-key pairs, not all); in the pool's dtype, with torch's fused CPU kernel accumulating in
  fp32 (as Hugging Face's `sdpa` attention does).
Masking, in both: a query at position i sees key position j iff j <= i and, with a
`sliding_window` w, i - j < w. Scores are s = scale * q.k; with a `logit_softcap` c they are
c * tanh(s / c) before the softmax, which `scaled_dot_product_attention` cannot do, so softcapped
attention forms its scores explicitly, in fp32.
Cache slots outside a sequence's context or before the window of its first new token may hold
anything (even NaN), and so may the block-table entries of blocks past its last or wholly before
that window (even -1): none of them reaches the output.
"""
import torch
import torch.nn.functional as F

from pdserve.kernels.kv_quant import dequantize_entries, quantize_entries, widen

# Query rows of one prefill call: on one core of an AMD EPYC, a 330-token SmolLM2 layer (9 heads,
# 3 KV heads, 64 dims) attends in 2.6 ms at 32-64 rows a call against 3.7 ms in one causal call.
QUERY_CHUNK = 64


def store_kv_reference(key, value, k_cache, v_cache, slot_mapping) -> None:
    if k_cache.dtype == torch.int8:  # one quantize for both: a step writes 2 x num_layers times
        key, value = quantize_entries(torch.stack((key, value)))
    num_kv_heads, entry_size = k_cache.shape[2:]
    k_cache.view(-1, num_kv_heads, entry_size)[slot_mapping] = key
    v_cache.view(-1, num_kv_heads, entry_size)[slot_mapping] = value


MIN_GROUP_LENGTH_RATIO = 0.8  # decode: fewest / most keys attended by sequences in one call
MAX_GROUP_KEY_BYTES = 1 << 20  # decode: fp32 padded K of one call, unless one sequence needs more


def decode_attention_reference(
    query, k_cache, v_cache, block_tables, context_lens, scale, *, sliding_window=None, logit_softcap=None
):
    out = torch.empty_like(query)  # [num_seqs, num_heads, head_dim]
    fp32_key_bytes = k_cache.shape[2] * query.shape[2] * 4
    max_keys = MAX_GROUP_KEY_BYTES // fp32_key_bytes
    # The new token sits at position context_len - 1 and sees the keys from key_start on.
    key_starts = torch.zeros_like(context_lens)  # [num_seqs]
    if sliding_window is not None:
        key_starts = (context_lens - sliding_window).clamp(min=0)
    for seqs in _similar_length_groups(context_lens - key_starts, max_keys):
        out[seqs] = _padded_decode_attention(
            query[seqs], k_cache, v_cache, block_tables[seqs], key_starts[seqs], context_lens[seqs], scale,
            logit_softcap,
        )
    return out


def _similar_length_groups(lengths, max_keys):
    """Sequence indices, longest first, cut into groups whose lengths are all at least
    MIN_GROUP_LENGTH_RATIO times the group's longest and, padded to it, sum to at most max_keys
    (a longer sequence forms a group of its own)."""
    lengths, order = lengths.sort(descending=True)
    groups, start = [], 0
    lengths = lengths.tolist()
    for end in range(1, len(lengths) + 1):
        if (end == len(lengths) or lengths[end] < MIN_GROUP_LENGTH_RATIO * lengths[start]
                or (end - start + 1) * lengths[start] > max_keys):
            groups.append(order[start:end])
            start = end
    return groups


def _padded_decode_attention(query, k_cache, v_cache, block_tables, key_starts, context_lens, scale, logit_softcap):
    key, value, visible = _gather_padded_keys(k_cache, v_cache, block_tables, key_starts, context_lens)
    args = (
        query[:, :, None].float(),  # [num_seqs, num_heads, 1, head_dim]
        key.transpose(1, 2),  # [num_seqs, num_kv_heads, num_keys, head_dim]
        value.transpose(1, 2),
        visible[:, None, None, :],  # [num_seqs, 1, 1, num_keys]
    )
    if logit_softcap is None:
        out = F.scaled_dot_product_attention(*args, scale=scale, enable_gqa=True)
    else:
        out = _softcapped_attention(*args, scale, logit_softcap)
    return out[:, :, 0].to(query.dtype)  # out [num_seqs, num_heads, 1, head_dim]


def prefill_attention_reference(
    query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, *, sliding_window=None,
    logit_softcap=None,
):
    out = torch.empty_like(query)  # [num_tokens, num_heads, head_dim]
    query_starts = query_start_loc.tolist()
    for seq, context_len in enumerate(context_lens.tolist()):
        start, end = query_starts[seq], query_starts[seq + 1]
        query_len = end - start
        prefix_len = context_len - query_len
        # New token i sits at position prefix_len + i and sees every key up to it in the window, so
        # keys from the first new token's window start on are read: key_start + k for key k.
        key_start = 0 if sliding_window is None else max(0, prefix_len - sliding_window + 1)
        # [num_keys, kv_heads, dim] each, in the query's dtype
        key = _gather_context(k_cache, block_tables[seq], key_start, context_len, query.dtype)
        value = _gather_context(v_cache, block_tables[seq], key_start, context_len, query.dtype)
        visible = torch.ones(query_len, context_len - key_start, dtype=torch.bool, device=query.device
                             ).tril(prefix_len - key_start)  # [query_len, num_keys]
        if sliding_window is not None:
            visible = visible.triu(prefix_len - key_start - sliding_window + 1)
        # Queries go QUERY_CHUNK rows at a time, each over the keys up to its last row: torch's
        # causal attention would score every query against every key, twice the work.
        for first in range(0, query_len, QUERY_CHUNK):
            last = min(query_len, first + QUERY_CHUNK)
            num_keys = prefix_len + last - key_start
            # 4-D inputs take torch's fused CPU attention; 3-D ones the unfused math path (~5x slower).
            args = (
                query[None, start + first:start + last].transpose(1, 2),  # [1, num_heads, rows, head_dim]
                key[None, :num_keys].transpose(1, 2),  # [1, num_kv_heads, num_keys, head_dim]
                value[None, :num_keys].transpose(1, 2),
            )
            chunk_visible = visible[first:last, :num_keys]
            if logit_softcap is None:
                attended = F.scaled_dot_product_attention(*args, attn_mask=chunk_visible, scale=scale, enable_gqa=True)
            else:
                attended = _softcapped_attention(*args, chunk_visible, scale, logit_softcap)
            out[start + first:start + last] = attended[0].transpose(0, 1)  # attended [1, num_heads, rows, head_dim]
    return out


def _softcapped_attention(query, key, value, visible, scale, logit_softcap):
    """Softcapped attention in fp32, returned in query's dtype: query [batch, num_heads, query_len,
    head_dim], key and value [batch, num_kv_heads, num_keys, head_dim], visible broadcastable to
    the scores [batch, num_heads, query_len, num_keys] (every query sees at least one key)."""
    queries_per_kv = query.shape[1] // key.shape[1]
    key = key.float().repeat_interleave(queries_per_kv, dim=1)  # [batch, num_heads, num_keys, head_dim]
    value = value.float().repeat_interleave(queries_per_kv, dim=1)
    scores = query.float() @ key.transpose(2, 3) * scale
    scores = logit_softcap * torch.tanh(scores / logit_softcap)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return (probs @ value).to(query.dtype)


def _gather_context(cache, block_table, start, end, dtype):
    """Positions start..end-1 of one sequence: a [end - start, num_kv_heads, head_dim] copy in `dtype`."""
    block_size = cache.shape[1]
    first_block = start // block_size
    blocks = cache.index_select(0, block_table[first_block:-(-end // block_size)].long()).flatten(0, 1)
    rows = blocks[start - first_block * block_size:end - first_block * block_size]
    return (dequantize_entries(rows) if cache.dtype == torch.int8 else rows).to(dtype)


def _gather_padded_keys(k_cache, v_cache, block_tables, key_starts, context_lens):
    """Every sequence's K and V from the block holding its key_start to its context's end, as
    dense fp32 [num_seqs, num_keys, num_kv_heads, head_dim] copies, num_keys covering the longest
    such span in whole blocks, zero outside key_start..context_len-1 (where the pool may hold NaN,
    which masking alone would not keep out of the output); and that range as visible
    [num_seqs, num_keys]."""
    num_seqs, max_blocks_per_seq = block_tables.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    key_starts, context_lens = key_starts.long()[:, None], context_lens.long()[:, None]  # [num_seqs, 1]
    first_blocks = key_starts // block_size
    num_blocks = -(-int((context_lens - first_blocks * block_size).max()) // block_size)
    num_keys = num_blocks * block_size
    positions = first_blocks * block_size + torch.arange(num_keys, device=k_cache.device)  # [num_seqs, num_keys]
    visible = (positions >= key_starts) & (positions < context_lens)
    # Table entries past a sequence's last block may be anything: read block 0 there instead.
    table_columns = (first_blocks + torch.arange(num_blocks, device=k_cache.device)).clamp(max=max_blocks_per_seq - 1)
    in_context = positions[:, ::block_size] < context_lens  # [num_seqs, num_blocks]
    block_ids = torch.where(in_context, block_tables.gather(1, table_columns).long(), 0)
    hidden_rows = (~visible).flatten().nonzero().squeeze(1)  # [num_hidden] flat (seq, key)

    def gather(cache):
        dense = widen(cache.index_select(0, block_ids.flatten()))  # [num_seqs * num_blocks, block_size, kv_heads, dim]
        dense = dense.view(num_seqs * num_keys, num_kv_heads, -1).index_fill_(0, hidden_rows, 0)
        return dense.view(num_seqs, num_keys, num_kv_heads, -1)

    return gather(k_cache), gather(v_cache), visible
