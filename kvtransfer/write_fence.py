"""The write fence of the in-place transports (shm, cuda_ipc), both ends: it keeps a writer in
another process out of the blocks of a reservation that has ended, however long that writer
was paused (SIGSTOP, a long GC) between its checks.

    /dev/shm/pdserve_fence_<hex>    one 8-byte slot per decode block: the block's generation

A reservation's blocks are its own while it lasts, so its first block names it; a `KVTarget`
carries the fence's name and the first block's generation when the reservation was made.

    writer (prefill)   `hold(target)`: opens the fence, locks the first block's slot (an
                       open-file-description lock, waiting while another holds it), checks that
                       the slot still holds the target's generation, and keeps the lock until
                       its copy has finished; closing the file, or the process ending, drops it
    decode             `WriteFence.try_close(block_id)`: takes the same lock without waiting;
                       while a writer holds it, False; else bumps the generation, True

Invariant: the blocks of an ended in-place reservation go to another request only after
`try_close` of its first block returned True. No writer held the lock then, and a writer that
takes it later finds another generation and writes nothing; a writer paused mid-copy holds the
lock, so the blocks stay out of reuse until it has finished, or its process is gone.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

from pdserve.kvtransfer.target import KVTarget
from pdserve.protocol.errors import TransferError

# Linux exposes POSIX shared-memory segments as files in this directory.
SHM_DIR = "/dev/shm"
_NAME_PREFIX = "pdserve_fence_"
_SLOT = struct.Struct("<Q")  # a block's generation
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on 64-bit Linux; l_pid stays 0 for OFD locks


class WriteFence:
    """The decode end: a fence of `num_blocks` slots in a new segment, which this process owns
    (`close()` unlinks it; the resource tracker unlinks it too if the process dies first)."""

    def __init__(self, num_blocks: int):
        segment = shared_memory.SharedMemory(
            name=_NAME_PREFIX + uuid.uuid4().hex, create=True, size=num_blocks * _SLOT.size)
        segment.close()  # kept only to unlink; the slots are read and written through `_fd`
        self._segment = segment
        self.name = segment.name
        self._fd = os.open(os.path.join(SHM_DIR, self.name), os.O_RDWR)

    def generation(self, block_id: int) -> int:
        return _read_generation(self._fd, block_id)

    def try_close(self, block_id: int) -> bool:
        """Ends in-place writes into the reservation whose first block is `block_id`: True once
        none can start or is in progress; False while a writer holds it (try again later)."""
        try:
            _lock(self._fd, block_id, fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
        except BlockingIOError:
            return False
        try:
            os.pwrite(self._fd, _SLOT.pack(self.generation(block_id) + 1), block_id * _SLOT.size)
        finally:
            _lock(self._fd, block_id, fcntl.F_OFD_SETLK, fcntl.F_UNLCK)
        return True

    def close(self) -> None:
        """Unlinks the segment (idempotent): a writer that opens it from now on fails."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._segment.unlink()


@contextlib.contextmanager
def hold(target: KVTarget) -> Iterator[None]:
    """The writer end: keeps the target's reservation from ending while the block runs; raises
    TransferError, having written nothing, if it has ended already."""
    try:
        fd = os.open(os.path.join(SHM_DIR, target.fence_name), os.O_RDWR)
    except OSError as error:
        raise TransferError(
            f"request {target.request_id}: cannot open the decode replica's write fence "
            f"{target.fence_name!r}: {error}") from error
    try:
        # Waits only while another holds the slot: the decode end for a moment, or the writer of
        # an ended reservation, checking as this one does.
        _lock(fd, target.block_ids[0], fcntl.F_OFD_SETLKW, fcntl.F_WRLCK)
        if _read_generation(fd, target.block_ids[0]) != target.fence_generation:
            raise TransferError(f"request {target.request_id}: the decode reservation ended before the copy")
        yield
    finally:
        os.close(fd)  # drops the lock


def _lock(fd: int, block_id: int, command: int, lock_type: int) -> None:
    fcntl.fcntl(fd, command, _FLOCK.pack(lock_type, os.SEEK_SET, block_id * _SLOT.size, _SLOT.size, 0))


def _read_generation(fd: int, block_id: int) -> int:
    return _SLOT.unpack(os.pread(fd, _SLOT.size, block_id * _SLOT.size))[0]
