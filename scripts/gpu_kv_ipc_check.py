"""Checks TRANSPORT_CUDA_IPC on a real NVIDIA GPU: two processes, bytes compared, GB/s printed.

A decode replica (its own process) owns a CUDA KV pool on `--decode-device` and serves
KVTransfer; this process, the prefill replica with its pool on `--device`, opens that pool
through CUDA IPC, copies scattered blocks device-to-device (across GPUs when the two differ) and
commits. The decode process then reads its own pool back: the reserved blocks must hold the
prefill blocks exactly, every other block must be untouched. Exits non-zero on any mismatch.

    python scripts/gpu_kv_ipc_check.py --mib 256 --device cuda:0                          # same GPU
    python scripts/gpu_kv_ipc_check.py --mib 256 --device cuda:0 --decode-device cuda:1   # across GPUs
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time

import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.testing.loopback import LoopbackConfig, LoopbackDecode
from pdserve.kvtransfer.transports import create_sender
from pdserve.v1 import common_pb2

CUDA_IPC = common_pb2.TRANSPORT_CUDA_IPC


async def send_repeatedly(decode, src, src_ids, dst_ids, num_repeats):
    """Returns the best seconds of `num_repeats` sends of the same blocks."""
    sender = create_sender(CUDA_IPC, decode.layout)
    timings_s = []
    try:
        for repeat in range(num_repeats):
            request_id = f"ipc-check-{repeat}"
            target = await asyncio.to_thread(decode.reserve, request_id, dst_ids, CUDA_IPC)
            start_s = time.perf_counter()
            result = await sender.send(request_id, src, src_ids, target)
            timings_s.append(time.perf_counter() - start_s)
            assert result.transport == CUDA_IPC
            await asyncio.to_thread(decode.release, request_id)
    finally:
        await sender.close()
    return min(timings_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="bytes of KV blocks to move, in MiB")
    parser.add_argument("--device", default="cuda:0", help="the prefill pool's")
    parser.add_argument("--decode-device", default=None, help="the decode pool's (default: --device)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device visible; this check needs one", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    decode_device = torch.device(args.decode_device or args.device)
    if max(device.index or 0, decode_device.index or 0) >= torch.cuda.device_count():
        print(f"{device} -> {decode_device}: this machine has {torch.cuda.device_count()} GPUs", file=sys.stderr)
        return 2
    torch.cuda.set_device(device)
    spec = KVCacheSpec(num_layers=32, num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.bfloat16)
    num_blocks = max(1, args.mib * 2**20 // spec.bytes_per_block)
    moved_bytes = num_blocks * spec.bytes_per_block
    generator = torch.Generator().manual_seed(0)
    src = torch.randn(spec.shape(num_blocks), generator=generator).to(device=device, dtype=spec.dtype)
    src_ids = torch.randperm(num_blocks, generator=generator).tolist()
    dst_ids = torch.randperm(2 * num_blocks, generator=generator)[:num_blocks].tolist()

    config = LoopbackConfig(spec, 2 * num_blocks, str(decode_device), "gpu-ipc-check", call_timeout_s=120.0)
    with LoopbackDecode(config) as decode:
        seconds = asyncio.run(send_repeatedly(decode, src, src_ids, dst_ids, args.repeats))
        decode_pool = decode.pool()  # read back by the decode process itself, on the host

    expected = src.cpu()
    landed_ok = torch.equal(decode_pool[:, :, dst_ids].view(torch.uint8), expected[:, :, src_ids].view(torch.uint8))
    untouched = sorted(set(range(2 * num_blocks)) - set(dst_ids))
    untouched_ok = not decode_pool[:, :, untouched].view(torch.uint8).any()

    dense_dst = torch.empty_like(src, device=decode_device)
    torch.cuda.synchronize(device)
    memcpy_s = float("inf")
    for _ in range(args.repeats):
        start_s = time.perf_counter()
        dense_dst.copy_(src)
        torch.cuda.synchronize(decode_device)
        memcpy_s = min(memcpy_s, time.perf_counter() - start_s)

    print(f"blocks: {num_blocks} ({moved_bytes / 2**20:.0f} MiB, {spec.dtype}) from {device} to {decode_device} "
          f"({torch.cuda.get_device_name(device)})")
    print("| path | seconds | GB/s |")
    print("|---|---:|---:|")
    print(f"| kvtransfer TRANSPORT_CUDA_IPC (send + commit) | {seconds:.4f} | {moved_bytes / seconds / 1e9:.1f} |")
    print(f"| torch copy_ {device} -> {decode_device}, one process | {memcpy_s:.4f} | {moved_bytes / memcpy_s / 1e9:.1f} |")
    print(f"reserved blocks hold the prefill bytes: {landed_ok}; other blocks untouched: {untouched_ok}")
    return 0 if landed_ok and untouched_ok else 1


if __name__ == "__main__":
    sys.exit(main())
