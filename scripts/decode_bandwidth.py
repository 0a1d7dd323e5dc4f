"""Effective bandwidth of the Triton decode kernel against this GPU's measured copy bandwidth.

One Llama-3-8B-like attention layer (32 query heads, 8 kv heads: GQA 8:1, head dim 128, bf16,
block size 16) decodes a batch whose sequences all hold `context_len` tokens in blocks scattered
over the cache. Bytes counted are each context token's K and V, read once; the time covers both
kernel passes (splits and reduction) and is averaged with CUDA events over repeated calls. The
yardstick is a device-to-device copy of a buffer far larger than the caches (bytes read plus
bytes written per second), timed the same way: what this GPU's memory delivers to a kernel
that only streams, rather than a datasheet peak.
"""
import argparse
import time
from collections.abc import Callable

import torch
import triton

from pdserve.kernels.triton_decode_attention import decode_attention

NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
BLOCK_SIZE = 16
DTYPE = torch.bfloat16


def seconds_per_call(fn: Callable[[], object], num_iters: int, device: torch.device) -> float:
    """Mean seconds of `fn()` over `num_iters` calls after two warm-up calls: CUDA events on a
    GPU, the wall clock on the CPU."""
    for _ in range(2):
        fn()
    if device.type != "cuda":
        started = time.perf_counter()
        for _ in range(num_iters):
            fn()
        return (time.perf_counter() - started) / num_iters
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(num_iters):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1e3 / num_iters


def copy_gbps(num_bytes: int, num_iters: int, device: torch.device) -> float:
    """Bytes read plus written per second by `copy_` of `num_bytes` on `device`."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * num_bytes / seconds_per_call(lambda: dst.copy_(src), num_iters, device) / 1e9


def decode_inputs(batch_size: int, context_len: int, device: torch.device = torch.device("cuda")) -> tuple:
    """decode_attention's arguments: `batch_size` sequences of `context_len` tokens each, their
    blocks scattered over the cache."""
    blocks_per_seq = triton.cdiv(context_len, BLOCK_SIZE)
    num_blocks = batch_size * blocks_per_seq
    cache_shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(cache_shape, dtype=DTYPE, device=device)
    v_cache = torch.randn(cache_shape, dtype=DTYPE, device=device)
    block_tables = torch.randperm(num_blocks, device=device, dtype=torch.int32).view(batch_size, -1)
    context_lens = torch.full((batch_size,), context_len, dtype=torch.int32, device=device)
    query = torch.randn(batch_size, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device=device)
    return query, k_cache, v_cache, block_tables, context_lens, HEAD_DIM**-0.5


def decode_seconds(batch_size: int, context_len: int, num_iters: int) -> float:
    args = decode_inputs(batch_size, context_len)
    return seconds_per_call(lambda: decode_attention(*args), num_iters, torch.device("cuda"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--context-lens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--copy-mib", type=int, default=4096, help="buffer the copy bandwidth is measured on")
    args = parser.parse_args()
    copy = copy_gbps(args.copy_mib * 2**20, args.iters, torch.device("cuda"))
    torch.cuda.empty_cache()
    print(f"decode on {torch.cuda.get_device_name()}, bf16, GQA {NUM_HEADS // NUM_KV_HEADS}:1, head dim {HEAD_DIM}; "
          f"measured device copy {copy:.0f} GB/s")
    print("| batch | context | kernel us | GB/s | of copy bandwidth |")
    print("|---:|---:|---:|---:|---:|")
    for batch_size in args.batch_sizes:
        for context_len in args.context_lens:
            seconds = decode_seconds(batch_size, context_len, args.iters)
            kv_bytes = 2 * batch_size * context_len * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize
            gbps = kv_bytes / seconds / 1e9
            print(f"| {batch_size} | {context_len} | {seconds * 1e6:.1f} | {gbps:.0f} | {gbps / copy:.0%} |")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
