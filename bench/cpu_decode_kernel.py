"""The compiled CPU decode attention kernel against the torch reference, on one batch shape.

Not a test: it times both on the same random paged batch (blocks scattered over the pool) and
prints the best of `--repeats` for each, after checking they agree.

    python -m bench.cpu_decode_kernel                                  # serving-like: 32 seqs, 129-256
    python -m bench.cpu_decode_kernel --num-seqs 64 --min-context 128 --max-context 700
"""
from __future__ import annotations

import argparse
import time

import torch

from pdserve.kernels import cpu_decode_attention
from pdserve.kernels.reference import decode_attention_reference


def random_batch(num_seqs, min_context, max_context, num_blocks, block_size, num_kv_heads, num_heads, head_dim,
                 seed):
    generator = torch.Generator().manual_seed(seed)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(cache_shape, generator=generator), torch.randn(cache_shape, generator=generator)
    context_lens = torch.randint(min_context, max_context + 1, (num_seqs,), generator=generator, dtype=torch.int32)
    max_blocks = -(-max_context // block_size)
    block_tables = torch.full((num_seqs, max_blocks), -1, dtype=torch.int32)
    free_blocks = torch.randperm(num_blocks, generator=generator)
    used = 0
    for seq, context_len in enumerate(context_lens.tolist()):
        needed = -(-context_len // block_size)
        block_tables[seq, :needed] = free_blocks[used:used + needed].to(torch.int32)
        used += needed
    query = torch.randn((num_seqs, num_heads, head_dim), generator=generator)
    return query, k_cache, v_cache, block_tables, context_lens, head_dim ** -0.5


def best_ms(fn, repeats: int) -> float:
    fn()
    times_s = []
    for _ in range(repeats):
        start_s = time.perf_counter()
        fn()
        times_s.append(time.perf_counter() - start_s)
    return 1000 * min(times_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=32)
    parser.add_argument("--min-context", type=int, default=129)
    parser.add_argument("--max-context", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=8192, help="pool size (the tiny model's default)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kv-heads", type=int, default=4)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (the kernel uses as many)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    library = cpu_decode_attention.load()
    if library is None:
        raise SystemExit("the compiled kernel is unavailable (no C compiler, or PDSERVE_CPU_KERNELS=0)")
    inputs = random_batch(args.num_seqs, args.min_context, args.max_context, args.num_blocks, args.block_size,
                          args.num_kv_heads, args.num_heads, args.head_dim, args.seed)
    compiled = cpu_decode_attention.decode_attention(library, *inputs)
    torch.testing.assert_close(compiled, decode_attention_reference(*inputs), atol=1e-4, rtol=1e-4)

    compiled_ms = best_ms(lambda: cpu_decode_attention.decode_attention(library, *inputs), args.repeats)
    reference_ms = best_ms(lambda: decode_attention_reference(*inputs), args.repeats)
    print(f"{args.num_seqs} sequences, contexts {args.min_context}-{args.max_context}, {args.threads} thread(s), "
          f"best of {args.repeats}")
    print(f"compiled  {compiled_ms:7.3f} ms")
    print(f"reference {reference_ms:7.3f} ms  ({reference_ms / compiled_ms:.1f}x the compiled kernel's time)")


if __name__ == "__main__":
    main()
