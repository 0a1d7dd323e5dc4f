"""The Triton paged prefill kernel equals the reference, under the interpreter.

Runs over the pairwise matrix (see conftest). Each batch packs sequences with no cached prefix
(a single token, and a prompt ending mid-block) and chunked-prefill sequences whose new tokens
follow a cached prefix (ending mid-block and on a block edge); unwritten cache slots are NaN.
16-row query tiles split the longer sequences into several tiles whose causal frontier moves
through the prefix; the default 64-row tiles are checked as well.
"""
from pdserve.kernels.reference import prefill_attention_reference
from pdserve.kernels.triton_prefill_attention import prefill_attention


def prefill_both(batch, **kernel_options):
    args = (
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.query_start_loc,
        batch.context_lens,
        batch.scale,
    )
    return prefill_attention(*args, **kernel_options), prefill_attention_reference(*args)


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
