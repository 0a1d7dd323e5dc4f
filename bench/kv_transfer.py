"""Bandwidth of the KV transports next to a plain torch copy of the same bytes.

Scattered blocks are sent to a decode replica in its own process (kvtransfer/testing/loopback.py),
`send` timed end to end; then its pool must hold exactly the bytes sent and nothing else, or the
run fails. On the CPU the transports are shm and grpc; with `--device cuda:N` cuda_ipc, between
GPUs with `--decode-device cuda:M`; `--decode-netns NS --decode-host ADDR` also times grpc to a
decode in network namespace NS (as tests/system/faults/test_across_hosts.py runs it).

    pdserve bench kv-transfer --mib 64
    pdserve bench kv-transfer --mib 256 --device cuda:0 --decode-device cuda:1
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path

import torch

from pdserve.bench.bandwidth import best_s
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.in_place import copy_blocks
from pdserve.kvtransfer.testing.loopback import LoopbackConfig, LoopbackDecode
from pdserve.kvtransfer.transports import create_sender
from pdserve.protocol.transport_choice import transport_name
from pdserve.v1 import common_pb2

NETNS_GRPC_PATH = "kvtransfer TRANSPORT_GRPC, decode in another network namespace"


class KVNotLanded(AssertionError):
    """The decode pool does not hold exactly the bytes sent to it."""


def measure(num_bytes: int = 64 * 2**20, dtype: torch.dtype = torch.bfloat16, num_repeats: int = 5,
            decode_netns: tuple[str, str] | None = None, device: torch.device = torch.device("cpu"),
            decode_device: torch.device | None = None) -> list[dict]:
    """A row ("path", "num_bytes", "seconds": the best repeat, "gb_per_s") per path timed;
    `decode_netns`: (namespace, address) of a decode across the network."""
    decode_device = decode_device or device
    transports = ((common_pb2.TRANSPORT_CUDA_IPC,) if device.type == "cuda"
                  else (common_pb2.TRANSPORT_SHM, common_pb2.TRANSPORT_GRPC))
    # A Llama-8B-like block (8 KV heads of 128, 16 tokens); 8 layers keep the pools small.
    spec = KVCacheSpec(num_layers=8, num_kv_heads=8, head_dim=128, block_size=16, dtype=dtype)
    num_blocks = max(1, num_bytes // spec.bytes_per_block)
    generator = torch.Generator().manual_seed(0)
    src = torch.randn(spec.shape(num_blocks), generator=generator).to(device, dtype)
    src_ids = torch.randperm(num_blocks, generator=generator).tolist()
    # The decode pool is twice as large and the prompt's blocks scattered over it.
    dst_ids = torch.randperm(2 * num_blocks, generator=generator)[:num_blocks].tolist()
    dense_dst, scattered_dst = torch.empty_like(src, device=decode_device), spec.allocate(2 * num_blocks, decode_device)
    seconds = {
        "torch copy_ (contiguous)": best_s(lambda: dense_dst.copy_(src), num_repeats, decode_device),
        "torch block copy (scattered)": best_s(lambda: copy_blocks(scattered_dst, dst_ids, src.to(decode_device),
                                                                   src_ids), num_repeats, decode_device)}
    config = LoopbackConfig(spec, 2 * num_blocks, str(decode_device), "bench", call_timeout_s=120.0)
    with LoopbackDecode(config) as decode:
        for transport in transports:
            seconds[f"kvtransfer {transport_name(transport)}"] = asyncio.run(
                _time_sends(decode, transport, src, src_ids, dst_ids, num_repeats))
        check_landed(decode.pool(), src.cpu(), src_ids, dst_ids)
    if decode_netns is not None:
        namespace, host = decode_netns
        with LoopbackDecode(dataclasses.replace(config, host=host, netns=namespace)) as decode:
            seconds[NETNS_GRPC_PATH] = asyncio.run(
                _time_sends(decode, common_pb2.TRANSPORT_GRPC, src, src_ids, dst_ids, num_repeats))
    num_bytes = num_blocks * spec.bytes_per_block
    return [{"path": path, "num_bytes": num_bytes, "seconds": s, "gb_per_s": num_bytes / s / 1e9}
            for path, s in seconds.items()]


async def _time_sends(decode: LoopbackDecode, transport: int, src: torch.Tensor, src_ids: list[int],
                      dst_ids: list[int], num_repeats: int) -> float:
    """Best `send` time over the repeats; one event loop, so the sender's channel is reused."""
    sender = create_sender(transport, decode.layout)
    timings_s = []
    try:
        for repeat in range(num_repeats):
            request_id = f"bench-{transport}-{repeat}"
            target = await asyncio.to_thread(decode.reserve, request_id, dst_ids, transport)
            start_s = time.perf_counter()
            await sender.send(request_id, src, src_ids, target)
            timings_s.append(time.perf_counter() - start_s)
    finally:
        await sender.close()
    return min(timings_s)


def check_landed(pool: torch.Tensor, src: torch.Tensor, src_ids: list[int], dst_ids: list[int]) -> None:
    """Raises KVNotLanded unless `pool`'s `dst_ids` blocks hold `src`'s `src_ids` blocks byte for
    byte and every other block of `pool` is zero (untouched)."""
    if not torch.equal(pool[:, :, dst_ids].view(torch.uint8), src[:, :, src_ids].view(torch.uint8)):
        raise KVNotLanded("the reserved blocks do not hold the bytes sent")
    untouched = sorted(set(range(pool.shape[2])) - set(dst_ids))
    if pool[:, :, untouched].view(torch.uint8).any():
        raise KVNotLanded("a block that was not reserved was written")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mib", type=int, default=64, help="bytes of KV blocks to move, in MiB")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--decode-netns", metavar="NS", help="also time grpc to a decode in this `ip netns`")
    parser.add_argument("--decode-host", metavar="ADDR", help="the address that decode serves at, in NS")
    parser.add_argument("--device", default="cpu", help="the prefill pool's: cpu, or cuda:N for cuda_ipc")
    parser.add_argument("--decode-device", help="the decode pool's (default: --device)")


def run(args: argparse.Namespace) -> int:
    if (args.decode_netns is None) != (args.decode_host is None):
        raise SystemExit("pdserve bench kv-transfer: --decode-netns and --decode-host go together")
    rows = measure(args.mib * 2**20, getattr(torch, args.dtype), args.repeats,
                   (args.decode_netns, args.decode_host) if args.decode_netns else None, torch.device(args.device),
                   torch.device(args.decode_device) if args.decode_device else None)
    print("| path | MiB | seconds | GB/s | vs torch copy_ |\n|---|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['path']} | {row['num_bytes'] / 2**20:.0f} | {row['seconds']:.4f} | {row['gb_per_s']:.2f} "
              f"| {row['gb_per_s'] / rows[0]['gb_per_s']:.2f}x |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"dtype": args.dtype, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":  # as tests/system/faults runs it, inside a network namespace
    main_parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(main_parser)
    raise SystemExit(run(main_parser.parse_args()))
