"""Children that die with their parent: the kernel sends them SIGTERM when `up` dies, kill -9
included, so nothing `up` started outlives it (Linux; elsewhere a no-op).

The request (PR_SET_PDEATHSIG) is made by a small exec wrapper, `python -m pdserve.parent_death
PARENT_PID ARGV...`, which asks for the signal, checks that its parent is still the process that
started it, and then becomes ARGV. A Popen `preexec_fn` would do it without the extra exec, but it
runs Python between fork and exec, which is unsafe in a process with other threads (gRPC's): the
child can crash or hang on a lock another thread held at the fork. Without one, Popen spawns by
vfork/posix_spawn, where nothing of the parent runs in the child.

PR_SET_PDEATHSIG fires when the *thread* that spawned the child exits, so children must be
started from a thread that lives as long as the process (`up` starts them from its main thread).
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_EXIT_CANNOT_EXEC = 127


def die_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv`, wrapped so that the kernel SIGTERMs it when this process dies."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-m", "pdserve.parent_death", str(os.getpid()), *argv]


def _exec_with_parent_death(parent_pid: int, argv: list[str]) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        sys.exit(f"parent {parent_pid} is gone; not starting {argv[0]}")
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        print(f"cannot run {argv[0]}: {error.strerror}", file=sys.stderr)
        sys.exit(_EXIT_CANNOT_EXEC)


if __name__ == "__main__":
    _exec_with_parent_death(int(sys.argv[1]), sys.argv[2:])
