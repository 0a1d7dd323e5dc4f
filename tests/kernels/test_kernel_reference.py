"""The pure-torch references equal naive dense attention built from the same K/V.

The dense side never sees the cache: it takes each sequence's K/V as generated, expands kv heads
for GQA, and runs softmax attention in fp64 with new token i of a sequence at position
context_len - query_len + i, hiding key j from query position p where j > p or, with a sliding
window w, p - j >= w, and softcapping scores s to c * tanh(s / c). This checks the paging,
masking, softcap and GQA mapping of the spec itself, over the whole pairwise matrix (see
conftest) and, masked, over every row of MASKINGS, with what a window hides made unreadable.
"""
import torch

from pdserve.kernels.reference import (
    decode_attention_reference,
    prefill_attention_reference,
    store_kv_reference,
)
from tests.kernels.conftest import LONG_WINDOW, KernelCase, decode_lens_around, prefill_lens_around


def dense_attention(query, key, value, scale, sliding_window=None, logit_softcap=None):
    """query [query_len, num_heads, head_dim]; key, value [context_len, num_kv_heads, head_dim]."""
    query_len, num_heads, _ = query.shape
    context_len, num_kv_heads, _ = key.shape
    queries_per_kv = num_heads // num_kv_heads
    key = key.double().repeat_interleave(queries_per_kv, dim=1)  # [context_len, num_heads, head_dim]
    value = value.double().repeat_interleave(queries_per_kv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.double(), key) * scale
    if logit_softcap is not None:
        scores = logit_softcap * torch.tanh(scores / logit_softcap)
    query_positions = torch.arange(context_len - query_len, context_len)[:, None]  # [query_len, 1]
    distance = query_positions - torch.arange(context_len)[None, :]  # [query_len, context_len]
    hidden = distance < 0
    if sliding_window is not None:
        hidden |= distance >= sliding_window
    probs = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, value)


def dense_attention_of(batch, **masking):
    """[num_new_tokens, num_heads, head_dim] fp64, sequence by sequence."""
    outputs = []
    for seq, (key, value) in enumerate(zip(batch.keys, batch.values)):
        start, end = batch.query_start_loc[seq], batch.query_start_loc[seq + 1]
        query = batch.query[start:end].cpu()
        outputs.append(dense_attention(query, key, value, batch.scale, **masking))
    return torch.cat(outputs)


def prefill_reference_of(batch, **masking):
    return prefill_attention_reference(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.context_lens,
        batch.scale,
        **masking,
    )


def test_decode_reference_matches_dense(kernel_case, paged_batch, assert_close_for_dtype):
    block_size = kernel_case.block_size
    context_lens = [1, block_size, block_size + 3, 3 * block_size - 1]
    batch = paged_batch(context_lens, [1] * len(context_lens), kernel_case)
    out = decode_attention_reference(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, batch.scale
    )
    assert out.dtype == kernel_case.dtype and out.shape == batch.query.shape
    assert_close_for_dtype(out, dense_attention_of(batch), kernel_case.dtype)


def test_prefill_reference_matches_dense_with_and_without_prefix(
    kernel_case, paged_batch, assert_close_for_dtype
):
    block_size = kernel_case.block_size
    # no prefix: one token, then two full blocks; cached prefix: a short and a block-crossing chunk
    context_lens = [1, 2 * block_size, block_size + 9, 3 * block_size + 2]
    query_lens = [1, 2 * block_size, 4, block_size + 1]
    batch = paged_batch(context_lens, query_lens, kernel_case)
    out = prefill_reference_of(batch)
    assert out.dtype == kernel_case.dtype and out.shape == batch.query.shape
    assert_close_for_dtype(out, dense_attention_of(batch), kernel_case.dtype)


def test_masked_decode_reference_matches_dense(
    kernel_case, sliding_window, logit_softcap, paged_batch, assert_close_for_dtype
):
    context_lens = decode_lens_around(sliding_window or LONG_WINDOW, kernel_case.block_size)
    batch = paged_batch(context_lens, [1] * len(context_lens), kernel_case, sliding_window=sliding_window)
    masking = dict(sliding_window=sliding_window, logit_softcap=logit_softcap)
    out = decode_attention_reference(
        batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, batch.scale, **masking
    )
    assert out.dtype == kernel_case.dtype and out.shape == batch.query.shape
    assert_close_for_dtype(out, dense_attention_of(batch, **masking), kernel_case.dtype)


def test_masked_prefill_reference_matches_dense(
    kernel_case, sliding_window, logit_softcap, paged_batch, assert_close_for_dtype
):
    lens = prefill_lens_around(sliding_window or LONG_WINDOW, kernel_case.block_size)
    batch = paged_batch(*lens, kernel_case, sliding_window=sliding_window)
    masking = dict(sliding_window=sliding_window, logit_softcap=logit_softcap)
    out = prefill_reference_of(batch, **masking)
    assert out.dtype == kernel_case.dtype and out.shape == batch.query.shape
    assert_close_for_dtype(out, dense_attention_of(batch, **masking), kernel_case.dtype)


def test_a_window_and_a_softcap_change_the_output(paged_batch):
    """Guards the masked tests above against masking that the inputs would hide."""
    case = KernelCase(torch.float32, 1, 8, 64)
    batch = paged_batch([20], [20], case)
    plain = prefill_reference_of(batch)
    windowed = prefill_reference_of(batch, sliding_window=3)
    softcapped = prefill_reference_of(batch, logit_softcap=2.0)
    assert torch.equal(windowed[:3], plain[:3])  # the first 3 positions see no further than the window
    assert (windowed[3:] - plain[3:]).abs().amax(dim=-1).gt(1e-3).all()  # every later token and head
    assert (softcapped - plain).abs().max() > 1e-2


def test_store_kv_reference_writes_exactly_the_mapped_slots():
    k_cache = torch.zeros(3, 4, 2, 8)  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache = torch.zeros(3, 4, 2, 8)
    key = torch.randn(2, 2, 8)  # [num_tokens, num_kv_heads, head_dim]
    value = torch.randn(2, 2, 8)
    store_kv_reference(key, value, k_cache, v_cache, torch.tensor([5, 8]))  # (1, 1) and (2, 0)
    torch.testing.assert_close(k_cache[1, 1], key[0])
    torch.testing.assert_close(k_cache[2, 0], key[1])
    torch.testing.assert_close(v_cache[1, 1], value[0])
    torch.testing.assert_close(v_cache[2, 0], value[1])
    assert k_cache.count_nonzero() == key.numel()
    assert v_cache.count_nonzero() == value.numel()
