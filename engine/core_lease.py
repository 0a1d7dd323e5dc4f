"""CPUs an idle prefill replica lends to the decode replica beside it, on a CPU host.

`pdserve up` pins each replica to CPUs of its own (pdserve/cpu_placement.py): two engines whose
OpenMP threads share a core stall each other, a descheduled worker holding up every parallel
region of a step. So a prefill replica's CPUs sit idle between prompts while the decode replica
beside it steps on its own CPUs alone. A core lease is one small file the two share (`up` makes
it): the prefill replica (the `Lender`) marks itself busy before each engine step and idle when
its engine has no work; the decode replica (the `Borrower`) runs each step on its own CPUs and
the lender's while the lender is idle, on its own alone while it is busy.

Invariant: the two engines' threads share the lent CPUs for at most one decode step. The lender
marks itself busy, then waits for the borrower to mark the CPUs returned before it steps; the
borrower returns them before any step that follows the lender's mark, and marks them borrowed
before it reads the lender's mark and widens. (The marks are plain stores to shared memory with
no fence between a store and the next load, so a borrower may, rarely, widen for one step just
as the lender starts: its next step sees the mark.) A borrower that stops answering while it
holds the CPUs (stopped, killed) holds the lender up once, for RECLAIM_TIMEOUT_S, and not again
until it has returned them; a restarted one starts with them returned.

The borrower widens its engine thread's CPU affinity and torch's thread count (which the compiled
kernels take) together; OpenMP workers started during a wide step inherit the wide affinity and
are idle in narrow ones.
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from pathlib import Path

logger = logging.getLogger(__name__)

LEASE_BYTES = 12  # int32 lender busy, int32 borrowed, int32 how many times the borrower returned them
_BUSY, _BORROWED, _RETURNS = 0, 4, 8
RECLAIM_TIMEOUT_S = 0.25  # longer than a decode step (up's --max-step-ms is 60 ms)
_POLL_S = 0.0002


def create_lease(path: Path) -> Path:
    """A new lease file at `path`: the lender idle, nothing borrowed."""
    path.write_bytes(bytes(LEASE_BYTES))
    return path


class _LeaseFile:
    def __init__(self, path: str | Path):
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), LEASE_BYTES)

    def read(self, offset: int) -> int:
        return struct.unpack_from("<i", self._map, offset)[0]

    def write(self, offset: int, value: int) -> None:
        struct.pack_into("<i", self._map, offset, value)


class Lender:
    """The prefill replica's side: `before_step` on its engine thread before each step, `idle`
    while its engine has no work."""

    def __init__(self, path: str | Path):
        self._lease = _LeaseFile(path)
        self._busy = False
        self._unanswered_at: int | None = None  # the borrower's returns when it last missed a deadline
        self.idle()

    def before_step(self) -> None:
        if self._busy and not self._lease.read(_BORROWED):
            return
        self._lease.write(_BUSY, 1)
        self._busy = True
        if self._unanswered_at is not None and self._unanswered_at == self._lease.read(_RETURNS):
            return  # waited for once already, and it has returned nothing since
        self._unanswered_at = None
        deadline = time.monotonic() + RECLAIM_TIMEOUT_S
        while self._lease.read(_BORROWED):
            if time.monotonic() >= deadline:
                logger.warning("the decode replica did not return the lent CPUs within %.2f s; "
                               "stepping without them", RECLAIM_TIMEOUT_S)
                self._unanswered_at = self._lease.read(_RETURNS)
                return
            time.sleep(_POLL_S)

    def idle(self) -> None:
        if self._busy or self._lease.read(_BUSY):
            self._lease.write(_BUSY, 0)
            self._busy = False


class Borrower:
    """The decode replica's side: `before_step` on its engine thread before each step, `idle`
    while its engine has no work. `own_cpus` are this process's, `lent_cpus` the lender's."""

    def __init__(self, path: str | Path, own_cpus: list[int], lent_cpus: list[int]):
        self._lease = _LeaseFile(path)
        self.own_cpus, self.lent_cpus = list(own_cpus), list(lent_cpus)
        self.wide = False
        self._lease.write(_BORROWED, 0)

    def before_step(self) -> None:
        if self._lease.read(_BUSY):
            self._narrow()
        elif not self.wide:
            self._lease.write(_BORROWED, 1)
            if self._lease.read(_BUSY):  # the lender took them back meanwhile
                self._lease.write(_BORROWED, 0)
            else:
                self._set_cpus(self.own_cpus + self.lent_cpus)
                self.wide = True

    def idle(self) -> None:
        self._narrow()

    def _narrow(self) -> None:
        if self.wide:
            self._set_cpus(self.own_cpus)
            self.wide = False
            self._lease.write(_BORROWED, 0)
            self._lease.write(_RETURNS, self._lease.read(_RETURNS) + 1)

    @staticmethod
    def _set_cpus(cpus: list[int]) -> None:
        """This thread's affinity (Linux: the calling thread's alone) and torch's thread count."""
        import torch  # here: `up` makes leases without loading torch

        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(len(cpus))
