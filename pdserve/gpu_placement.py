"""Which GPU each replica of `pdserve up --device cuda` runs on (pure policy).

Each replica gets its own GPU while there are enough: prefill replicas first, then decode, in
device order, and round robin once every GPU has one (then some share). `--prefill-gpus` and
`--decode-gpus` name one GPU per replica of their kind instead; a kind left unnamed takes the
GPUs the other list leaves free, round robin (all of them if it leaves none).

A replica is told its GPU as `--device cuda:K`, and every child keeps this process's view of the
GPUs (no per-child CUDA_VISIBLE_DEVICES), so K names the same GPU in all of them: CUDA IPC
between a prefill and a decode replica relies on that.
"""
from __future__ import annotations

from collections.abc import Sequence


class PlacementError(ValueError):
    """The GPUs asked for do not exist, or do not match the replica counts."""


def place_replicas(
    num_prefill: int, num_decode: int, num_gpus: int,
    prefill_gpus: Sequence[int] | None = None, decode_gpus: Sequence[int] | None = None,
) -> tuple[list[int], list[int]]:
    """(GPU of each prefill replica, GPU of each decode replica)."""
    if num_gpus < 1:
        raise PlacementError("--device cuda, and no CUDA device is visible")
    for flag, gpus, count in (("--prefill-gpus", prefill_gpus, num_prefill), ("--decode-gpus", decode_gpus, num_decode)):
        if gpus is None:
            continue
        if len(gpus) != count:
            raise PlacementError(f"{flag} names {len(gpus)} GPUs for {count} replicas")
        if any(not 0 <= gpu < num_gpus for gpu in gpus):
            raise PlacementError(f"{flag} {','.join(map(str, gpus))}: this machine has GPUs 0..{num_gpus - 1}")
    if prefill_gpus is None and decode_gpus is None:
        order = _round_robin(list(range(num_gpus)), num_prefill + num_decode)
        return order[:num_prefill], order[num_prefill:]
    named = {*(prefill_gpus or ()), *(decode_gpus or ())}
    free = [gpu for gpu in range(num_gpus) if gpu not in named] or list(range(num_gpus))
    return (list(prefill_gpus) if prefill_gpus is not None else _round_robin(free, num_prefill),
            list(decode_gpus) if decode_gpus is not None else _round_robin(free, num_decode))


def _round_robin(gpus: list[int], count: int) -> list[int]:
    return [gpus[i % len(gpus)] for i in range(count)]
