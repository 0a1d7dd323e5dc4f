"""The compiled CPU decode kernel equals the reference on every KV dtype it serves x GQA ratio x
block size x head dim.

The full product of the float pools (54 cases) runs, the kernel being fast; an int8 pool (its
entries quantized from a float32 one, the query float32 or bfloat16) runs the same batches. Each
batch mixes a length-1 context, contexts that end mid-block and on a block edge, and one spanning
many blocks, in a shuffled pool
whose unwritten slots are NaN and whose block tables are padded with -1. Masked, each row of
MASKINGS runs on contexts shorter than, equal to and longer than the window, with what the window
hides unreadable. The kernel is built by the system C compiler into a cache directory private to
the test session.
"""
import dataclasses
import functools
import itertools

import pytest
import torch

from pdserve.kernels import cpu_decode_attention
from pdserve.kernels.kv_quant import quantize_entries
from pdserve.kernels.reference import decode_attention_reference
from tests.kernels.conftest import (
    BLOCK_SIZES,
    HEAD_DIMS,
    LONG_WINDOW,
    QUERIES_PER_KV,
    KernelCase,
    built_without_avx512,
    decode_lens_around,
)


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        cpu_decode_attention.load.cache_clear()
        libraries = {dtype: cpu_decode_attention.load(dtype) for dtype in cpu_decode_attention.KV_DTYPE_FLAGS}
        cpu_decode_attention.load.cache_clear()
    if None in libraries.values():
        pytest.skip("no C compiler: the compiled CPU kernel is unavailable")
    return libraries


@pytest.fixture
def library(libraries):
    return libraries[torch.float32]


FLOAT_KV_DTYPES = [dtype for dtype in cpu_decode_attention.KV_DTYPE_FLAGS if dtype.is_floating_point]


def decode_both(library, batch, **masking):
    args = (batch.query, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, batch.scale)
    return (cpu_decode_attention.decode_attention(library, *args, **masking),
            decode_attention_reference(*args, **masking))


def in_int8_pool(batch, query_dtype):
    """`batch` (of a float32 pool) with its pool's entries quantized and its query in `query_dtype`."""
    return dataclasses.replace(batch, query=batch.query.to(query_dtype), k_cache=quantize_entries(batch.k_cache),
                               v_cache=quantize_entries(batch.v_cache))


@pytest.mark.parametrize(
    "case", [KernelCase(*axes) for axes in itertools.product(FLOAT_KV_DTYPES, QUERIES_PER_KV, BLOCK_SIZES, HEAD_DIMS)],
    ids=str)
def test_matches_reference(libraries, paged_batch, assert_close_for_dtype, case):
    block_size = case.block_size
    context_lens = [1, block_size + 3, 2 * block_size, 9 * block_size + 5]
    batch = paged_batch(context_lens, [1] * len(context_lens), case, device="cpu")

    out, expected = decode_both(libraries[case.dtype], batch)

    assert out.shape == batch.query.shape and out.dtype == case.dtype
    assert_close_for_dtype(out, expected)


@pytest.mark.parametrize(
    "case", [KernelCase(dtype, queries_per_kv, 16, head_dim) for dtype in FLOAT_KV_DTYPES
             for queries_per_kv, head_dim in ((4, 40), (2, 48), (16, 64), (1, 256))],
    ids=str)
def test_shapes_off_and_at_the_edges_of_the_vector_path_match_reference(libraries, paged_batch,
                                                                         assert_close_for_dtype, case):
    """Built with AVX-512, head dims that are multiples of 16 with at most 8 query heads per kv head
    take the vector passes: 40, 48 and 16 heads per kv head take the portable ones, 256 the widest."""
    context_lens = [1, 21, 16 * 9 + 5]
    batch = paged_batch(context_lens, [1] * len(context_lens), case, device="cpu")

    out, expected = decode_both(libraries[case.dtype], batch)

    assert_close_for_dtype(out, expected)


@pytest.mark.parametrize(
    "case", [KernelCase(*axes, head_dim=64) for axes in itertools.product(
        FLOAT_KV_DTYPES, QUERIES_PER_KV, BLOCK_SIZES)],
    ids=str)
def test_masked_matches_reference(libraries, paged_batch, assert_close_for_dtype, case, sliding_window, logit_softcap):
    context_lens = decode_lens_around(sliding_window or LONG_WINDOW, case.block_size)
    batch = paged_batch(context_lens, [1] * len(context_lens), case, device="cpu", sliding_window=sliding_window)

    out, expected = decode_both(libraries[case.dtype], batch, sliding_window=sliding_window,
                                logit_softcap=logit_softcap)

    assert_close_for_dtype(out, expected)


@pytest.fixture(scope="module")
def without_avx512(libraries):
    """Each pool dtype's kernel built with AVX-512 off: the AVX2 passes where the CPU has AVX2 and
    FMA, else the portable ones."""
    built = {dtype: built_without_avx512(functools.partial(cpu_decode_attention.build, dtype), lambda: library)
             for dtype, library in libraries.items()}
    assert None not in built.values()
    return built


@pytest.mark.parametrize(
    "case", [KernelCase(dtype, queries_per_kv, block_size, head_dim) for dtype in FLOAT_KV_DTYPES
             for queries_per_kv, block_size, head_dim in ((1, 16, 64), (4, 8, 80), (8, 32, 128), (2, 16, 256),
                                                          (16, 16, 64), (4, 16, 40))],
    ids=str)
def test_the_build_without_avx512_matches_reference(without_avx512, paged_batch, assert_close_for_dtype, case):
    """Without AVX-512, head dims that are multiples of 8 with at most 8 query heads per kv head take
    the AVX2 passes (an int8 pool too); 16 query heads per kv head and head dim 40 the portable ones."""
    context_lens = [1, case.block_size + 3, 2 * case.block_size, 9 * case.block_size + 5]
    batch = paged_batch(context_lens, [1] * len(context_lens), case, device="cpu")
    for masking in ({}, {"sliding_window": 2 * case.block_size + 1, "logit_softcap": 30.0}):
        out, expected = decode_both(without_avx512[case.dtype], batch, **masking)
        assert_close_for_dtype(out, expected)
    if case.dtype == torch.float32:
        int8_batch = in_int8_pool(batch, torch.float32)
        out, expected = decode_both(without_avx512[torch.int8], int8_batch)
        assert_close_for_dtype(out, expected)


@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("queries_per_kv, head_dim", [(1, 64), (4, 64), (2, 128), (4, 40), (16, 64)])
def test_int8_pool_matches_reference(libraries, paged_batch, assert_close_for_dtype, query_dtype, queries_per_kv,
                                     head_dim):
    """Head dims 64 and 128 take the vector passes, 40 and 16 query heads per kv head the portable ones."""
    case = KernelCase(torch.float32, queries_per_kv, 16, head_dim)
    context_lens = [1, 19, 32, 16 * 9 + 5]
    batch = in_int8_pool(paged_batch(context_lens, [1] * len(context_lens), case, device="cpu"), query_dtype)

    out, expected = decode_both(libraries[torch.int8], batch)

    assert out.dtype == query_dtype
    assert_close_for_dtype(out, expected)


def test_int8_pool_masked_matches_reference(libraries, paged_batch, assert_close_for_dtype, sliding_window,
                                            logit_softcap):
    case = KernelCase(torch.float32, 4, 16, 64)
    context_lens = decode_lens_around(sliding_window or LONG_WINDOW, case.block_size)
    batch = in_int8_pool(paged_batch(context_lens, [1] * len(context_lens), case, device="cpu",
                                     sliding_window=sliding_window), torch.float32)

    out, expected = decode_both(libraries[torch.int8], batch, sliding_window=sliding_window,
                                logit_softcap=logit_softcap)

    assert_close_for_dtype(out, expected)


def test_threads_split_sequences_without_changing_results(library, paged_batch):
    case = KernelCase(torch.float32, 4, 16, 64)
    batch = paged_batch([5, 40, 300, 17, 1, 64, 129], [1] * 7, case, device="cpu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread, _ = decode_both(library, batch)
        torch.set_num_threads(2)
        two_threads, _ = decode_both(library, batch)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one_thread, two_threads)


def test_a_sequence_split_into_parts_is_the_same_alone_in_a_batch_and_on_any_threads(library, paged_batch):
    """A context of many 64-key parts, computed by one thread or split among two, alone or beside
    other sequences, gives the same bits; a window starting mid-part too."""
    case = KernelCase(torch.float32, 3, 16, 64)
    batch = paged_batch([1000, 7, 300, 65], [1] * 4, case, device="cpu")
    alone = dataclasses.replace(batch, query=batch.query[:1], block_tables=batch.block_tables[:1],
                                context_lens=batch.context_lens[:1])
    threads = torch.get_num_threads()
    outputs = []
    try:
        for num_threads, which, masking in itertools.product((1, 2), (alone, batch), ({}, {"sliding_window": 517})):
            torch.set_num_threads(num_threads)
            out, expected = decode_both(library, which, **masking)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
            outputs.append((masking, out[0]))
    finally:
        torch.set_num_threads(threads)
    for masking, out in outputs:
        assert torch.equal(out, next(first for m, first in outputs if m == masking))


@pytest.mark.parametrize("dtype", FLOAT_KV_DTYPES, ids=str)
def test_a_query_read_in_place_from_a_fused_projection_gives_the_same_bits(libraries, paged_batch, dtype):
    batch = paged_batch([5, 130, 33], [1] * 3, KernelCase(dtype, 4, 16, 64), device="cpu")
    num_seqs, num_heads, head_dim = batch.query.shape
    fused = torch.randn(num_seqs, (num_heads + 2) * head_dim).to(dtype)  # query heads, then others
    fused[:, :num_heads * head_dim] = batch.query.reshape(num_seqs, -1)
    in_place = dataclasses.replace(batch, query=fused[:, :num_heads * head_dim].view(num_seqs, num_heads, head_dim))
    assert not in_place.query.is_contiguous()
    assert torch.equal(decode_both(libraries[dtype], in_place)[0], decode_both(libraries[dtype], batch)[0])


def test_no_sequences_give_an_empty_output(library, paged_batch):
    batch = paged_batch([20], [1], KernelCase(torch.float32, 1, 16, 64), device="cpu")
    empty = dataclasses.replace(batch, query=batch.query[:0], block_tables=batch.block_tables[:0],
                                context_lens=batch.context_lens[:0])
    out, _ = decode_both(library, empty)
    assert out.shape == (0, *batch.query.shape[1:])


def test_block_id_outside_the_pool_is_an_error(library, paged_batch):
    batch = paged_batch([20, 20], [1, 1], KernelCase(torch.float32, 1, 16, 64), device="cpu")
    batch.block_tables[1, 1] = batch.k_cache.shape[0]
    with pytest.raises(ValueError, match="sequence 1 has context length 20"):
        decode_both(library, batch)


def test_disabled_or_without_compiler_it_is_not_loaded(monkeypatch):
    for env in ({"PDSERVE_CPU_KERNELS": "0"}, {"CC": "no-such-compiler"}):
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            cpu_decode_attention.load.cache_clear()
            assert cpu_decode_attention.load() is None
    cpu_decode_attention.load.cache_clear()


def test_a_dtype_without_a_build_is_not_loaded():
    assert cpu_decode_attention.load(torch.float16) is None
