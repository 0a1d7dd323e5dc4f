"""The Triton paged prefill kernel equals the reference, under the interpreter.

Runs over the pairwise matrix (see conftest). Each batch packs sequences with no cached prefix
(a single token, and a prompt ending mid-block) and chunked-prefill sequences whose new tokens
follow a cached prefix (ending mid-block and on a block edge); unwritten cache slots are NaN.
16-row query tiles split the longer sequences into several tiles whose causal frontier moves
through the prefix; the default 64-row tiles are checked as well. Masked, each row of MASKINGS
runs on prompts longer and shorter than the window and chunks after cached prefixes shorter and
longer than it, with what the window hides unreadable, in query tiles twice as tall as their key
tiles, so that some rows see nothing of a key tile that others do. An int8 pool (one case per
dtype) is read as the reference widens it, in 16-row tiles.
"""
import torch

from pdserve.kernels.reference import prefill_attention_reference
from pdserve.kernels.triton_prefill_attention import prefill_attention
from tests.kernels.conftest import LONG_WINDOW, KernelCase, prefill_lens_around


def prefill_both(batch, sliding_window=None, logit_softcap=None, **tiles):
    args = (
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.context_lens,
        batch.scale,
    )
    masking = dict(sliding_window=sliding_window, logit_softcap=logit_softcap)
    return prefill_attention(*args, **tiles, **masking), prefill_attention_reference(*args, **masking)


def mixed_prefill_lens(block_size):
    """(context_lens, query_lens): prefix 0, 0, 2 blocks, block_size - 1."""
    context_lens = [1, block_size + 3, 2 * block_size + 5, 3 * block_size]
    query_lens = [1, block_size + 3, 5, 2 * block_size + 1]
    return context_lens, query_lens


def test_prefill_matches_reference_with_small_tiles(kernel_case, paged_batch, assert_close_for_dtype):
    batch = paged_batch(*mixed_prefill_lens(kernel_case.block_size), kernel_case)
    out, expected = prefill_both(batch, query_tile=16, key_tile=16)
    assert out.dtype == kernel_case.dtype and out.shape == batch.query.shape
    assert_close_for_dtype(out, expected)


def test_prefill_matches_reference_with_default_tiles(kernel_case, paged_batch, assert_close_for_dtype):
    batch = paged_batch(*mixed_prefill_lens(kernel_case.block_size), kernel_case, seed=1)
    out, expected = prefill_both(batch)
    assert_close_for_dtype(out, expected)


def test_prefill_from_an_int8_pool_matches_reference(kernel_case, kv_dtype, paged_batch, assert_close_for_dtype):
    batch = paged_batch(*mixed_prefill_lens(kernel_case.block_size), kernel_case, kv_dtype=kv_dtype)
    out, expected = prefill_both(batch, query_tile=16, key_tile=16)
    assert_close_for_dtype(out, expected)


def test_masked_prefill_matches_reference(
    kernel_case, sliding_window, logit_softcap, paged_batch, assert_close_for_dtype
):
    lens = prefill_lens_around(sliding_window or LONG_WINDOW, kernel_case.block_size)
    batch = paged_batch(*lens, kernel_case, sliding_window=sliding_window)
    out, expected = prefill_both(batch, sliding_window, logit_softcap, query_tile=32, key_tile=16)
    assert_close_for_dtype(out, expected)


def test_a_windowed_prompt_prefilled_in_chunks_equals_it_prefilled_whole(paged_batch, assert_close_for_dtype):
    """Chunks whose cached prefix is shorter, then longer, than the window."""
    sliding_window, chunk_ends = 5, [3, 12, 29, 40]
    batch = paged_batch([chunk_ends[-1]], [chunk_ends[-1]], KernelCase(torch.float32, 4, 8, 64))
    masking = dict(sliding_window=sliding_window, logit_softcap=2.0)
    cache = (batch.k_cache, batch.v_cache, batch.block_tables)
    whole = prefill_attention(batch.query, *cache, batch.query_start_loc, batch.context_lens, batch.scale, **masking)

    chunks = []
    for start, end in zip([0, *chunk_ends], chunk_ends):
        query_start_loc = torch.tensor([0, end - start], dtype=torch.int32, device=batch.query.device)
        context_lens = torch.tensor([end], dtype=torch.int32, device=batch.query.device)
        chunks.append(prefill_attention(batch.query[start:end], *cache, query_start_loc, context_lens, batch.scale,
                                        query_tile=16, key_tile=16, **masking))

    assert_close_for_dtype(torch.cat(chunks), whole)
