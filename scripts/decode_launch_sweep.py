"""Times the decode kernel's launch candidates on a GPU and prints the fastest (DecodeLaunch).

The shapes are decode_bandwidth.py's layer (GQA 8:1, head dim 128, bf16, block size 16) at each
batch size and context length asked for; the candidates every combination of the splits, tiles,
warps and stages asked for. Each candidate is timed at every shape before the next one starts,
so a run the budget cuts short still ranks like with like. A candidate's score is the geometric
mean over the shapes of its time over that shape's fastest: 1.0 is fastest everywhere. The
table lists the best few and the serving default; `--out` keeps every time as JSON.
"""
import argparse
import dataclasses
import itertools
import json
import math
import time
from pathlib import Path

import torch

from decode_bandwidth import decode_inputs, seconds_per_call
from pdserve.kernels.triton_decode_attention import DecodeLaunch, decode_attention

Shape = tuple[int, int]  # (batch size, context tokens)


def ranked(seconds: dict[DecodeLaunch, dict[Shape, float]]) -> list[tuple[DecodeLaunch, float]]:
    """(candidate, score) from the fastest, over the candidates timed at every shape."""
    shapes = set().union(*seconds.values()) if seconds else set()
    complete = {launch: times for launch, times in seconds.items() if set(times) == shapes}
    best_s = {shape: min(times[shape] for times in complete.values()) for shape in shapes}
    scores = {launch: math.exp(sum(math.log(times[shape] / best_s[shape]) for shape in shapes) / len(shapes))
              for launch, times in complete.items()}
    return sorted(scores.items(), key=lambda item: item[1])


def candidates(args: argparse.Namespace) -> list[DecodeLaunch]:
    """Every combination asked for, the serving default first."""
    grid = [DecodeLaunch(split, tile, warps, stages) for split, tile, warps, stages in itertools.product(
        args.split_tokens, args.tile_tokens, args.num_warps, args.num_stages)]
    return [DecodeLaunch(), *(launch for launch in grid if launch != DecodeLaunch())]


def _optional_ints(text: str) -> list[int | None]:
    return [None if word == "default" else int(word) for word in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(word) for word in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-sizes", type=_ints, default=[32, 64])
    parser.add_argument("--context-lens", type=_ints, default=[4096, 8192, 16384])
    parser.add_argument("--split-tokens", type=_optional_ints, default=[None, 512, 1024, 2048],
                        help="comma-separated; 'default' is the width rule")
    parser.add_argument("--tile-tokens", type=_optional_ints, default=[None, 32, 64, 128])
    parser.add_argument("--num-warps", type=_ints, default=[2, 4, 8])
    parser.add_argument("--num-stages", type=_ints, default=[2, 3])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=100.0, help="stop starting candidates after this")
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--out", type=Path, help="every time, as JSON")
    args = parser.parse_args()
    device = torch.device(args.device)
    shapes = [(batch_size, context_len) for batch_size in args.batch_sizes for context_len in args.context_lens]
    inputs = {shape: decode_inputs(*shape, device) for shape in shapes}
    launches = candidates(args)
    deadline_s = time.monotonic() + args.budget_s
    seconds: dict[DecodeLaunch, dict[Shape, float]] = {}
    for index, launch in enumerate(launches):
        if time.monotonic() > deadline_s:
            print(f"budget spent: {index} of {len(launches)} candidates timed", flush=True)
            break
        seconds[launch] = {shape: seconds_per_call(lambda: decode_attention(*inputs[shape], launch=launch),
                                                   args.iters, device) for shape in shapes}
        print(f"[{index + 1}/{len(launches)}] {launch}", flush=True)
    ranking = ranked(seconds)
    print(f"decode launch sweep on {torch.cuda.get_device_name() if device.type == 'cuda' else device}, "
          f"shapes (batch, context) {shapes}")
    print("| rank | split | tile | warps | stages | score | " + " | ".join(f"{b}x{c} us" for b, c in shapes) + " |")
    print("|---:|---:|---:|---:|---:|---:|" + "---:|" * len(shapes))
    for rank, (launch, score) in enumerate(ranking, 1):
        if rank <= args.top or launch == DecodeLaunch():
            times = " | ".join(f"{seconds[launch][shape] * 1e6:.1f}" for shape in shapes)
            print(f"| {rank}{' (default)' if launch == DecodeLaunch() else ''} | {launch.split_tokens or 'rule'} | "
                  f"{launch.tile_tokens or 'rule'} | {launch.num_warps} | {launch.num_stages} | {score:.3f} | {times} |")
    if args.out:
        args.out.write_text(json.dumps([{**dataclasses.asdict(launch), "seconds": {f"{b}x{c}": s for (b, c), s in times.items()}}
                                        for launch, times in seconds.items()], indent=1))


if __name__ == "__main__":
    main()
