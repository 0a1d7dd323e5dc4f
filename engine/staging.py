"""A step's host-built index lists to device tensors in one copy per dtype.

On CUDA the lists are packed into one pinned host buffer and copied without blocking the host,
so building a step's inputs queues copies behind the previous work instead of waiting for it;
the copies stay ordered before the kernels that read them (same stream). On CPU the packed
tensor is the result, with no copy. Each list starts on a 16-byte boundary of the buffer, as a
tensor of its own would: Triton specializes kernels on pointer alignment, and a shifted start
would compile (and run) another variant.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

ALIGN_BYTES = 16


def stage(parts: Sequence[Sequence[int]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """One 1-D tensor of `dtype` on `device` per list in `parts`, views of one buffer."""
    align = ALIGN_BYTES // dtype.itemsize
    values: list[int] = []
    starts = []
    for part in parts:
        values += [0] * (-len(values) % align)
        starts.append(len(values))
        values += part
    flat = torch.tensor(values, dtype=dtype)  # [total, padding included]
    if device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    return [flat[start:start + len(part)] for start, part in zip(starts, parts)]
