"""Shared kernel-test inputs: the test matrix, random paged batches and dtype tolerances.

A test that takes a `kernel_case` argument runs once per row of an L9 orthogonal array over
dtype x GQA ratio x block size x head dim: rows (a, b, a+b mod 3, a+2b mod 3) for a, b in 0..2.
Every value of every axis appears three times and every pair of values from two different axes
appears exactly once, in 9 runs instead of the 81 of the full product.

A test that takes `sliding_window` and `logit_softcap` arguments runs once per row of MASKINGS;
one that takes both those and `kernel_case` runs once per (dtype, masking) pair, on the dtype's
three cases in turn (MASKED_CASES: 12 runs, where the full product with the L9 rows would be 36).
One that takes `kernel_case` and `kv_dtype` runs with an int8 pool on INT8_POOL_CASES: one L9 row
per dtype, together covering every block size and head dim.

A paged batch scatters each sequence's blocks over a shuffled block pool, leaves every cache slot
that no token was written to as NaN, and pads block tables with -1, so a kernel that reads
outside a sequence's context shows NaN (or crashes) instead of passing by luck. Built for a
sliding window, it does the same to what the window hides from all of a sequence's new tokens,
as an engine that frees it may: those slots are NaN and the table entries of their whole blocks -1.
Built with `kv_dtype=torch.int8`, the pool holds int8 entries (kernels/kv_quant.py) of the same
K and V, and a NaN slot is an entry whose scale is NaN.

Kernel inputs live on the CPU under the Triton interpreter (the default set by the root conftest)
and on the GPU when a run sets TRITON_INTERPRET=0.

The compiled CPU kernels' tests build their library in a cache private to the module
(`built_in_private_cache`) and set torch's thread count, which the kernels take, with `threads`.
Their builds with AVX-512 off are the module's own library where the CPU has no AVX-512
(`built_without_avx512`): the same code, not compiled twice.
"""
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pdserve.kernels.kv_quant import quantize_entries
from pdserve.kernels.reference import store_kv_reference

CPU_HAS_AVX512 = Path("/proc/cpuinfo").exists() and "avx512f" in Path("/proc/cpuinfo").read_text().split()


def built_without_avx512(build: Callable, native: Callable):
    """`build(("-mno-avx512f",))`, or `native()` (this machine's build) where the CPU has no AVX-512."""
    return build(("-mno-avx512f",)) if CPU_HAS_AVX512 else native()


@pytest.fixture
def threads():
    """Sets torch's thread count for the test (the compiled kernels take it), restoring it after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def built_in_private_cache(tmp_path_factory, load: Callable) -> Iterator[None]:
    """The body of a module's fixture: `load`'s library (a functools.cache'd loader) built in a
    cache private to the module while it runs; the module is skipped without a C compiler."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        load.cache_clear()
        if load() is None:
            pytest.skip("no C compiler: the compiled kernel is unavailable")
        yield
        load.cache_clear()


DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QUERIES_PER_KV = (1, 4, 8)
BLOCK_SIZES = (8, 16, 32)
HEAD_DIMS = (64, 80, 128)
NUM_KV_HEADS = 2
DEVICE = torch.device("cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda")

# Loose enough for tensor-core products on a GPU, where probabilities are rounded to the input
# dtype before the P @ V product; the interpreter multiplies in fp32 and lands far inside them.
TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}


@dataclass(frozen=True)
class KernelCase:
    dtype: torch.dtype
    queries_per_kv: int
    block_size: int
    head_dim: int

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{dtype}-gqa{self.queries_per_kv}-bs{self.block_size}-d{self.head_dim}"


# (sliding_window, logit_softcap): a window inside one block, one longer than every block size (so
# it crosses block edges), a softcap alone, and both. A softcap of 2 visibly bends these random
# inputs' scores, which have about unit variance.
LONG_WINDOW = 37
MASKINGS = [(3, None), (LONG_WINDOW, None), (None, 2.0), (LONG_WINDOW, 2.0)]


def masking_id(masking) -> str:
    sliding_window, logit_softcap = masking
    return "-".join([*([f"window{sliding_window}"] if sliding_window else []),
                     *([f"softcap{logit_softcap:g}"] if logit_softcap else [])])


def decode_lens_around(window: int, block_size: int) -> list[int]:
    """Context lengths shorter than, equal to and longer than `window`, the longest by two blocks
    and more."""
    return [1, window - 1, window, window + 1, window + 2 * block_size + 3]


def prefill_lens_around(window: int, block_size: int) -> tuple[list[int], list[int]]:
    """(context_lens, query_lens): prompts longer and shorter than `window`; chunks after a cached
    prefix shorter and longer than it; one new token whose context equals it."""
    context_lens = [window + block_size + 3, window - 1, window + 5, window + 2 * block_size + 3, window]
    query_lens = [window + block_size + 3, window - 1, 6, block_size + 1, 1]
    return context_lens, query_lens


PAIRWISE_CASES = [
    KernelCase(DTYPES[a], QUERIES_PER_KV[b], BLOCK_SIZES[(a + b) % 3], HEAD_DIMS[(a + 2 * b) % 3])
    for a in range(3)
    for b in range(3)
]


MASKED_CASES = [
    (PAIRWISE_CASES[3 * a + m % 3], *masking)  # PAIRWISE_CASES[3a:3a+3] are dtype a's rows
    for a in range(3)
    for m, masking in enumerate(MASKINGS)
]


INT8_POOL_CASES = PAIRWISE_CASES[1::3]


def pytest_generate_tests(metafunc):
    masked = {"sliding_window", "logit_softcap"} <= set(metafunc.fixturenames)
    if "kv_dtype" in metafunc.fixturenames:
        metafunc.parametrize("kernel_case, kv_dtype", [(case, torch.int8) for case in INT8_POOL_CASES],
                             ids=[f"{case}-int8pool" for case in INT8_POOL_CASES])
    elif masked and "kernel_case" in metafunc.fixturenames:
        metafunc.parametrize("kernel_case, sliding_window, logit_softcap", MASKED_CASES,
                             ids=[f"{case}-{masking_id(masking)}" for case, *masking in MASKED_CASES])
    elif "kernel_case" in metafunc.fixturenames:
        metafunc.parametrize("kernel_case", PAIRWISE_CASES, ids=str)
    elif masked:
        metafunc.parametrize("sliding_window, logit_softcap", MASKINGS, ids=[masking_id(m) for m in MASKINGS])


@dataclass(frozen=True)
class PagedBatch:
    keys: list[torch.Tensor]  # per sequence [context_len, num_kv_heads, head_dim], on the CPU
    values: list[torch.Tensor]  # per sequence [context_len, num_kv_heads, head_dim], on the CPU
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, entry_size]
    v_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, entry_size]
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, padded with -1
    context_lens: torch.Tensor  # [num_seqs] int32
    query: torch.Tensor  # [num_new_tokens, num_heads, head_dim]
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    scale: float


def make_paged_batch(
    context_lens: list[int],
    query_lens: list[int],
    case: KernelCase,
    seed: int = 0,
    device: torch.device = DEVICE,
    sliding_window: int | None = None,
    kv_dtype: torch.dtype | None = None,
) -> PagedBatch:
    """Sequences whose last query_lens[s] of context_lens[s] tokens are the new (query) tokens, in
    a pool of `kv_dtype` (the case's dtype unless given)."""
    generator = torch.Generator().manual_seed(seed)
    block_size, head_dim, dtype = case.block_size, case.head_dim, case.dtype
    blocks_per_seq = [-(-context_len // block_size) for context_len in context_lens]
    num_blocks = sum(blocks_per_seq) + 1
    block_order = torch.randperm(num_blocks, generator=generator)
    block_tables = torch.full((len(context_lens), max(blocks_per_seq) + 1), -1, dtype=torch.int32)
    kv_dtype = kv_dtype or dtype
    unwritten = torch.full((NUM_KV_HEADS, head_dim), float("nan"))
    # [num_kv_heads, entry_size]: NaN, or int8 entries of NaN scale
    unwritten = quantize_entries(unwritten) if kv_dtype == torch.int8 else unwritten.to(kv_dtype)
    k_cache = unwritten.expand(num_blocks, block_size, *unwritten.shape).clone()
    v_cache = k_cache.clone()
    keys, values = [], []
    first_block = 0
    for seq, (context_len, query_len, num_seq_blocks) in enumerate(zip(context_lens, query_lens, blocks_per_seq)):
        seq_blocks = block_order[first_block : first_block + num_seq_blocks]
        first_block += num_seq_blocks
        block_tables[seq, :num_seq_blocks] = seq_blocks.to(torch.int32)
        positions = torch.arange(context_len)
        slot_mapping = seq_blocks[positions // block_size] * block_size + positions % block_size
        shape = (context_len, NUM_KV_HEADS, head_dim)
        keys.append(torch.randn(shape, generator=generator).to(dtype))
        values.append(torch.randn(shape, generator=generator).to(dtype))
        store_kv_reference(keys[-1], values[-1], k_cache, v_cache, slot_mapping)
        if sliding_window is not None:
            hidden_slots = slot_mapping[: max(0, context_len - query_len - sliding_window + 1)]
            k_cache.view(-1, *unwritten.shape)[hidden_slots] = unwritten
            v_cache.view(-1, *unwritten.shape)[hidden_slots] = unwritten
            block_tables[seq, : len(hidden_slots) // block_size] = -1
    num_heads = NUM_KV_HEADS * case.queries_per_kv
    query = torch.randn((sum(query_lens), num_heads, head_dim), generator=generator).to(dtype)
    query_start_loc = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return PagedBatch(
        keys=keys,
        values=values,
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=block_tables.to(device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        query=query.to(device),
        query_start_loc=query_start_loc.to(device),
        scale=head_dim**-0.5,
    )


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def paged_batch():
    """Factory: paged_batch(context_lens, query_lens, case, seed=0, device=DEVICE, sliding_window=None,
    kv_dtype=None) -> PagedBatch."""
    return make_paged_batch


@pytest.fixture
def assert_close_for_dtype():
    """assert_close(actual, expected, dtype=expected.dtype): compared in fp64 on the CPU with the
    tolerance of `dtype`."""

    def assert_close(actual, expected, dtype=None):
        tolerance = TOLERANCES[dtype or expected.dtype]
        torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), **tolerance)

    return assert_close
