"""The block tables of the running requests, kept on the device between steps.

One int32 tensor `[max_num_seqs, max_blocks_per_seq]` holds a row per running request, assigned
the first step it is scheduled and given back when it leaves the batch (finishes, is aborted or
preempted). Entries `row[:n]` equal the first n blocks of the request's table, n being what
the device has been sent so far; a request's table only grows while it runs, so each step sends
just the blocks appended since, as (flat index into the tensor, block id) pairs, and a new row
all of its table. Entries past a row's table keep whatever an earlier request left there:
valid block ids or 0, and never read, since attention reads a row only up to its context
length, which its table covers.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from pdserve.engine.scheduler import ScheduledChunk


class BlockTable:
    def __init__(self, max_num_seqs: int, max_blocks_per_seq: int, device: torch.device):
        self.max_blocks_per_seq = max_blocks_per_seq
        self.table = torch.zeros(max_num_seqs, max_blocks_per_seq, dtype=torch.int32,
                                 device=device)  # [max_num_seqs, max_blocks_per_seq]
        self._rows: dict[str, int] = {}  # request id -> row
        self._num_sent = [0] * max_num_seqs  # leading entries of each row that hold its table
        self._free_rows = list(reversed(range(max_num_seqs)))  # lowest last, taken first

    def release(self, request_ids: Iterable[str]) -> None:
        """Gives back the rows of requests that left the batch; ids without a row are ignored."""
        for request_id in request_ids:
            row = self._rows.pop(request_id, None)
            if row is not None:
                self._free_rows.append(row)

    def diff(self, chunks: list[ScheduledChunk]) -> tuple[list[int], list[int], list[int]]:
        """(each chunk's row, flat indices, block ids): the rows to gather for the step and the
        writes that bring them up to the chunks' block tables. Marks those writes as sent."""
        rows, flat_indices, block_ids = [], [], []
        for chunk in chunks:
            request_id, table = chunk.request.request_id, chunk.block_table
            if len(table) > self.max_blocks_per_seq:
                raise ValueError(f"request {request_id}: {len(table)} blocks, rows hold {self.max_blocks_per_seq}")
            row = self._rows.get(request_id)
            if row is None:
                row = self._rows[request_id] = self._free_rows.pop()
                self._num_sent[row] = 0
            start = row * self.max_blocks_per_seq
            flat_indices += range(start + self._num_sent[row], start + len(table))
            block_ids += table[self._num_sent[row]:]
            self._num_sent[row] = len(table)
            rows.append(row)
        return rows, flat_indices, block_ids

    def write(self, flat_indices: torch.Tensor, block_ids: torch.Tensor) -> None:
        """Applies a step's writes: `flat_indices` [num_writes] int64, `block_ids` [num_writes] int32."""
        self.table.view(-1).index_copy_(0, flat_indices, block_ids)

    def gather(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """[len(rows), width] int32, contiguous: the first `width` entries of each of `rows`."""
        return self.table[:, :width].index_select(0, rows)
