"""The compiled CPU prefill kernel equals the reference (in float32, on the same inputs) within
its dtype's tolerance, for float32 and bfloat16, in its AVX-512 builds and its portable ones
(built without AVX-512F for float32, without AVX512-BF16 for bfloat16; on a CPU without them both
builds are portable).

Batches pack a one-token prompt, prompts ending mid-block and spanning several 16-row work items
and 16-key tiles, and chunks after a cached prefix (ending mid-block and on a block edge), in a
shuffled pool whose unwritten slots are NaN and whose block tables are padded with -1. Every GQA
ratio, block size and head dim runs; masked, a sliding window inside one block and one longer than
every block, with what the window hides unreadable (NaN slots, -1 block ids).
"""
import itertools

import pytest
import torch

from pdserve.kernels import cpu_prefill_attention
from pdserve.kernels.reference import prefill_attention_reference
from tests.kernels.conftest import BLOCK_SIZES, LONG_WINDOW, KernelCase, built_in_private_cache, prefill_lens_around

DTYPES = list(cpu_prefill_attention.DTYPE_FLAGS)
PORTABLE_FLAGS = {torch.float32: ("-mno-avx512f",), torch.bfloat16: ("-mno-avx512bf16",)}


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    yield from built_in_private_cache(tmp_path_factory, cpu_prefill_attention.load)


@pytest.fixture(params=DTYPES, ids=str)
def dtype(request):
    return request.param


@pytest.fixture(params=["native", "portable"])
def library(request, dtype):
    library = cpu_prefill_attention.load(dtype, PORTABLE_FLAGS[dtype] if request.param == "portable" else ())
    if library is None:  # a compiler that knows no -mno-avx512* (not x86)
        pytest.skip(f"the {request.param} build is unavailable here")
    return library


def prefill_both(library, batch, sliding_window=None):
    args = (batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc,
            batch.context_lens, batch.scale)
    out = cpu_prefill_attention.prefill_attention(library, *args, sliding_window=sliding_window)
    as_float32 = (batch.query.float(), batch.k_cache.float(), batch.v_cache.float(), *args[3:])
    return out, prefill_attention_reference(*as_float32, sliding_window=sliding_window)


def mixed_prefill_lens(block_size):
    """(context_lens, query_lens): prompts of 1, 37 and 70 tokens; chunks after prefixes of 2 blocks
    + 5 and block_size - 1."""
    context_lens = [1, 37, 70, 2 * block_size + 5 + 21, 3 * block_size]
    query_lens = [1, 37, 70, 21, 2 * block_size + 1]
    return context_lens, query_lens


@pytest.mark.parametrize("queries_per_kv, block_size, head_dim", list(itertools.product(
    (1, 3, 4, 8), BLOCK_SIZES, (64, 80, 128, 256))))
def test_matches_reference(library, dtype, paged_batch, assert_close_for_dtype, queries_per_kv, block_size, head_dim):
    case = KernelCase(dtype, queries_per_kv, block_size, head_dim)
    batch = paged_batch(*mixed_prefill_lens(block_size), case, device="cpu")

    out, expected = prefill_both(library, batch)

    assert out.shape == batch.query.shape and out.dtype == dtype
    assert_close_for_dtype(out, expected, dtype)


@pytest.mark.parametrize("sliding_window", [3, LONG_WINDOW])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_sliding_window_matches_reference(library, dtype, paged_batch, assert_close_for_dtype, block_size,
                                          sliding_window):
    case = KernelCase(dtype, 3, block_size, 64)
    batch = paged_batch(*prefill_lens_around(sliding_window, block_size), case, device="cpu",
                        sliding_window=sliding_window)

    out, expected = prefill_both(library, batch, sliding_window)

    assert_close_for_dtype(out, expected, dtype)


def test_a_row_is_the_same_bits_whatever_the_thread_count(library, dtype, paged_batch, threads):
    batch = paged_batch(*mixed_prefill_lens(16), KernelCase(dtype, 3, 16, 64), device="cpu")
    outs = []
    for num_threads in (1, 2):
        threads(num_threads)
        outs.append(prefill_both(library, batch)[0])

    assert torch.equal(*outs)


def test_a_block_id_outside_the_pool_is_refused(library, dtype, paged_batch):
    batch = paged_batch(*mixed_prefill_lens(16), KernelCase(dtype, 3, 16, 64), device="cpu")
    batch.block_tables[2, 1] = batch.k_cache.shape[0]

    with pytest.raises(ValueError, match="sequence 2"):
        prefill_both(library, batch)

