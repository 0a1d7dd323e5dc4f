"""Effective bandwidth of the Triton decode kernel: bytes of K/V read per second of kernel time.

One Llama-3-8B-like attention layer (32 query heads, 8 kv heads, head dim 128, bf16, block size
16) decodes a batch whose sequences all hold `context_len` tokens in blocks scattered over the
cache. Bytes counted are each context token's K and V, read once; the time covers both kernel
passes (splits and reduction) and is averaged with CUDA events over repeated calls.
"""
import argparse

import torch
import triton

from kernels.triton_decode_attention import decode_attention

NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
BLOCK_SIZE = 16
DTYPE = torch.bfloat16


def decode_seconds(batch_size: int, context_len: int, num_iters: int) -> float:
    blocks_per_seq = triton.cdiv(context_len, BLOCK_SIZE)
    num_blocks = batch_size * blocks_per_seq
    cache_shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(cache_shape, dtype=DTYPE, device="cuda")
    v_cache = torch.randn(cache_shape, dtype=DTYPE, device="cuda")
    block_tables = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(batch_size, -1)
    context_lens = torch.full((batch_size,), context_len, dtype=torch.int32, device="cuda")
    query = torch.randn(batch_size, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    args = (query, k_cache, v_cache, block_tables, context_lens, HEAD_DIM**-0.5)

    for _ in range(3):  # compile and warm up
        decode_attention(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(num_iters):
        decode_attention(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / num_iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--context-lens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--hbm-gbps", type=float, default=4800.0, help="peak memory bandwidth (H200: 4800)")
    args = parser.parse_args()
    print(f"decode on {torch.cuda.get_device_name()}, batch {args.batch_size}, bf16")
    for context_len in args.context_lens:
        seconds = decode_seconds(args.batch_size, context_len, args.iters)
        kv_bytes = 2 * args.batch_size * context_len * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize
        gbps = kv_bytes / seconds / 1e9
        print(f"context {context_len:>6}: {seconds * 1e6:9.1f} us  {gbps:7.0f} GB/s  ({gbps / args.hbm_gbps:.0%} of peak)")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
