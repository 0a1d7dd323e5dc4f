"""Which block-table widths cover every Triton compile that serving can trigger (pure policy).

A Triton launch compiles anew for each new set of constexprs and for each new specialization of
its integer arguments (Triton specializes an int that equals 1 or is a multiple of 16). For one
model, dtype and block size, the only launch input serving varies beyond grid sizes is the
block-table width, the batch's longest context in blocks: the decode launcher derives its split
size, NUM_SPLITS_PAD and TILE_TOKENS from it (and from a layer's sliding window, which caps the
keys a token attends), and both attention launchers pass it as the block table's row stride. A
layer's window and softcap are constexprs, fixed per layer. `warm_up_widths` returns the smallest
width of each distinct variant over the model's windows, so a warm-up that runs every layer once
at each width compiles everything serving can later ask for.

This models Triton's specialization rule as stated above; that no compile follows the warm-up
is checked only on a GPU.
"""
from __future__ import annotations

from pdserve.kernels.triton_decode_attention import (
    default_split_tokens,
    max_attended_keys,
    reduce_kernel_constants,
    split_kernel_constants,
)

_PROBE_HEAD_DIM = 128  # the keys below do not depend on the model's shape
_PROBE_QUERIES_PER_KV = 1


def launch_key(width: int, block_size: int, sliding_window: int | None = None) -> tuple:
    """What decides which compiled variants a launch with block tables `width` blocks wide uses,
    in a layer of `sliding_window` (None: none)."""
    max_keys = max_attended_keys(width * block_size, sliding_window)
    split_tokens = default_split_tokens(max_keys)
    num_splits = -(-max_keys // split_tokens)
    split = split_kernel_constants(_PROBE_HEAD_DIM, _PROBE_QUERIES_PER_KV, block_size, split_tokens, False)
    return (split["TILE_TOKENS"], reduce_kernel_constants(_PROBE_HEAD_DIM, num_splits)["NUM_SPLITS_PAD"],
            _int_specialization(split_tokens), _int_specialization(width))


def warm_up_widths(
    max_blocks_per_seq: int, block_size: int, sliding_windows: tuple[int | None, ...] = (None,)
) -> list[int]:
    """The smallest width in 1..max_blocks_per_seq of each distinct tuple of `launch_key`s over a
    model's layers' `sliding_windows`, ascending."""
    widths: dict[tuple, int] = {}
    for width in range(1, max_blocks_per_seq + 1):
        widths.setdefault(tuple(launch_key(width, block_size, window) for window in sliding_windows), width)
    return sorted(widths.values())


def _int_specialization(value: int) -> str:
    return "one" if value == 1 else "multiple of 16" if value % 16 == 0 else "other"
