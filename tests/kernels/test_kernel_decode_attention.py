"""The Triton split-KV decode kernel equals the reference, under the interpreter.

Runs over the pairwise matrix (see conftest). Each batch mixes a length-1 context, contexts that
end mid-block and on a block edge, and one spanning several blocks; unwritten cache slots are NaN.
Splits of 16 tokens force several splits per sequence, partially filled last tiles, and splits
past short contexts that must be skipped by the reduction; the default split (one split of
several 64-token tiles at these sizes) is checked as well, and so are launches the GPU sweep
tries (tiles smaller and larger than their split, other warps and stages). Masked, each row of
MASKINGS runs on contexts shorter than, equal to and longer than the window, with what the window
hides unreadable, in 16-token splits (so the window starts mid-split and mid-block) and the default.
An int8 pool (one case per dtype) is read as the reference widens it, windowed, in 16-token splits.
"""
import pytest

from pdserve.kernels.reference import decode_attention_reference
from pdserve.kernels.triton_decode_attention import DecodeLaunch, decode_attention
from tests.kernels.conftest import LONG_WINDOW, decode_lens_around


def decode_both(batch, launch=DecodeLaunch(), **masking):
    cache = (batch.k_cache, batch.v_cache, batch.block_tables)
    args = (batch.query, *cache, batch.context_lens, batch.scale)
    return decode_attention(*args, launch, **masking), decode_attention_reference(*args, **masking)


def test_decode_matches_reference_across_splits(kernel_case, paged_batch, assert_close_for_dtype):
    block_size = kernel_case.block_size
    context_lens = [1, block_size + 3, 2 * block_size, 3 * block_size + 5]
    batch = paged_batch(context_lens, [1] * len(context_lens), kernel_case)
    out, expected = decode_both(batch, launch=DecodeLaunch(split_tokens=16))
    assert out.dtype == kernel_case.dtype and out.shape == batch.query.shape
    assert_close_for_dtype(out, expected)


def test_decode_with_default_split_matches_reference(
    kernel_case, paged_batch, assert_close_for_dtype
):
    block_size = kernel_case.block_size
    context_lens = [2 * block_size - 1, 1, 5 * block_size]
    batch = paged_batch(context_lens, [1] * len(context_lens), kernel_case, seed=1)
    out, expected = decode_both(batch)
    assert_close_for_dtype(out, expected)


def test_decode_with_swept_launch_parameters_matches_reference(
    kernel_case, paged_batch, assert_close_for_dtype
):
    """Launches the sweep tries: tiles smaller and larger than the split, other warps and stages."""
    block_size = kernel_case.block_size
    context_lens = [3 * block_size + 5, 1, 7 * block_size]
    batch = paged_batch(context_lens, [1] * len(context_lens), kernel_case, seed=2)
    for launch in (DecodeLaunch(split_tokens=64, tile_tokens=16, num_warps=2, num_stages=1),
                   DecodeLaunch(split_tokens=32, tile_tokens=128, num_warps=8, num_stages=4)):
        out, expected = decode_both(batch, launch=launch)
        assert_close_for_dtype(out, expected)


def test_masked_decode_matches_reference(
    kernel_case, sliding_window, logit_softcap, paged_batch, assert_close_for_dtype
):
    context_lens = decode_lens_around(sliding_window or LONG_WINDOW, kernel_case.block_size)
    batch = paged_batch(context_lens, [1] * len(context_lens), kernel_case, sliding_window=sliding_window)
    for launch in (DecodeLaunch(split_tokens=16), DecodeLaunch()):
        out, expected = decode_both(batch, launch, sliding_window=sliding_window, logit_softcap=logit_softcap)
        assert_close_for_dtype(out, expected)


def test_decode_from_an_int8_pool_matches_reference(kernel_case, kv_dtype, paged_batch, assert_close_for_dtype):
    context_lens = decode_lens_around(LONG_WINDOW, kernel_case.block_size)
    batch = paged_batch(context_lens, [1] * len(context_lens), kernel_case, sliding_window=LONG_WINDOW,
                        kv_dtype=kv_dtype)
    out, expected = decode_both(batch, DecodeLaunch(split_tokens=16), sliding_window=LONG_WINDOW)
    assert_close_for_dtype(out, expected)


def test_a_tile_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(ValueError, match="power of 2"):
        DecodeLaunch(tile_tokens=48)
