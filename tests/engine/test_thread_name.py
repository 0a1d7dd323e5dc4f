"""The engine thread carries its name to the operating system, where /proc reads it."""
import sys
import threading
from pathlib import Path

import pytest

from pdserve.engine.thread_name import name_this_thread


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/task/TID/comm is Linux's")
def test_a_named_thread_shows_its_name_in_proc():
    seen = {}

    def run():
        name_this_thread("engine-of-a-long-name")
        seen["comm"] = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=10)
    assert seen["comm"] == "engine-of-a-lon"  # 15 bytes
    assert Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip() != "engine-of-a-lon"
