"""The decode attention kernel (compiled on the CPU, Triton with `--device cuda`) against the
torch reference on one random paged batch, its blocks scattered over the pool: checked to agree,
then the best of `--repeats` for each and the kernel's GB/s of K and V against the read bandwidth
(`bench.bandwidth`). Each of `--num-layers` layers has its own pool, all attended per repeat as a
decode step does, so the reads come from memory rather than the caches.

    pdserve bench decode-kernel --dtype bfloat16 --num-layers 30 --num-kv-heads 3 --num-heads 9 \\
        --head-dim 64 --min-context 300 --max-context 560                # SmolLM2's decode step, batch 32
    pdserve bench decode-kernel --device cuda --dtype bfloat16 --num-seqs 64 --num-kv-heads 8 \\
        --num-heads 32 --head-dim 128 --min-context 8192 --max-context 8192    # an 8B layer on a GPU
"""
from __future__ import annotations

import argparse

import torch

from pdserve.bench.bandwidth import best_s, read_gbps
from pdserve.kernels.reference import decode_attention_reference

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def random_batch(args: argparse.Namespace, dtype: torch.dtype, device: torch.device):
    """(query, [(k_cache, v_cache)] * num_layers, block_tables, context_lens, scale); the pool holds
    --num-blocks blocks, by default twice those the batch needs."""
    generator = torch.Generator().manual_seed(args.seed)
    context_lens = torch.randint(args.min_context, args.max_context + 1, (args.num_seqs,), generator=generator,
                                 dtype=torch.int32)
    blocks_needed = [-(-context_len // args.block_size) for context_len in context_lens.tolist()]
    num_blocks = args.num_blocks or 2 * sum(blocks_needed)
    cache_shape = (num_blocks, args.block_size, args.num_kv_heads, args.head_dim)
    caches = [tuple(torch.randn(cache_shape, generator=generator).to(device, dtype) for _ in range(2))
              for _ in range(args.num_layers)]
    block_tables = torch.full((args.num_seqs, -(-args.max_context // args.block_size)), -1, dtype=torch.int32)
    free_blocks, used = torch.randperm(num_blocks, generator=generator), 0
    for seq, needed in enumerate(blocks_needed):
        block_tables[seq, :needed] = free_blocks[used:used + needed].to(torch.int32)
        used += needed
    query = torch.randn((args.num_seqs, args.num_heads, args.head_dim), generator=generator).to(device, dtype)
    return query, caches, block_tables.to(device), context_lens.to(device), args.head_dim ** -0.5


def kernel(device: torch.device, dtype: torch.dtype):
    """The decode attention function under test on `device`."""
    if device.type == "cuda":
        from pdserve.kernels.triton_decode_attention import decode_attention
        return decode_attention
    from pdserve.kernels import cpu_decode_attention
    library = cpu_decode_attention.load(dtype)
    if library is None:
        raise SystemExit("the compiled kernel is unavailable (no C compiler, or PDSERVE_CPU_KERNELS=0)")
    return lambda *args: cpu_decode_attention.decode_attention(library, *args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu (the compiled kernel) or cuda[:N] (the Triton one)")
    for flag, default in (("--num-seqs", 32), ("--min-context", 129), ("--max-context", 256), ("--block-size", 16),
                          ("--num-kv-heads", 4), ("--num-heads", 8), ("--head-dim", 32), ("--repeats", 30),
                          ("--seed", 0)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--num-blocks", type=int, help="pool size (default: twice what the batch needs)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="of the query and the pool")
    parser.add_argument("--num-layers", type=int, default=1, help="pools attended per repeat, one per layer")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (the CPU kernel uses as many)")


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    attend = kernel(device, dtype)
    query, caches, *rest = random_batch(args, dtype, device)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(attend(query, *caches[0], *rest), decode_attention_reference(query, *caches[0], *rest),
                               atol=tolerance, rtol=tolerance)

    def attend_all(fn):
        for k_cache, v_cache in caches:
            fn(query, k_cache, v_cache, *rest)

    kernel_ms = 1e3 * best_s(lambda: attend_all(attend), args.repeats, device)
    reference_ms = 1e3 * best_s(lambda: attend_all(decode_attention_reference), args.repeats, device)
    kv_gb = 2 * args.num_layers * int(rest[1].sum()) * args.num_kv_heads * args.head_dim * query.element_size() / 1e9
    gbps = read_gbps(device)
    print(f"{args.num_seqs} sequences, contexts {args.min_context}-{args.max_context}, {args.dtype}, "
          f"{args.num_layers} layer(s) on {device}, {args.threads} thread(s), best of {args.repeats}; "
          f"read bandwidth {gbps:.1f} GB/s")
    print(f"kernel    {kernel_ms:7.3f} ms  ({kv_gb / kernel_ms * 1e3:.1f} GB/s of K and V, "
          f"{kv_gb / kernel_ms * 1e3 / gbps:.0%} of the read bandwidth)")
    print(f"reference {reference_ms:7.3f} ms  ({reference_ms / kernel_ms:.1f}x the kernel's time)")
    return 0
