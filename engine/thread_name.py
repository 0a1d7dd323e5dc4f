"""Names the calling thread for the operating system (Linux: its `comm`, at most 15 bytes), so
`top -H`, py-spy and /proc/PID/task/TID/comm tell the engine thread from gRPC's and asyncio's.
Python's own thread names stay inside the interpreter. Elsewhere, or where prctl is missing,
nothing happens."""
from __future__ import annotations

import ctypes
import sys

ENGINE_THREAD_NAME = "engine"  # engine/async_engine.py's thread
_PR_SET_NAME = 15
MAX_NAME_BYTES = 15


def name_this_thread(name: str) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:MAX_NAME_BYTES]), 0, 0, 0)
