"""Children that die with their parent: the kernel sends them SIGTERM when `up` dies, kill -9
included, so nothing `up` started outlives it (Linux; elsewhere a no-op).

PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so children must be
started from a thread that lives as long as the process (`up` starts them from its main thread).
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent_fn() -> Callable[[], None] | None:
    """A Popen preexec_fn that asks the kernel to SIGTERM the child when its parent dies."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded here, not between fork and exec
    parent_pid = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent_pid:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent
