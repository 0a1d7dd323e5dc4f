"""freeze_startup_heap leaves the garbage that exists when it is called out of later collections,
while garbage made after it is still collected."""
import gc
import weakref

import pytest

from pdserve.cluster.gc_heap import freeze_startup_heap


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only a collection frees it


@pytest.fixture
def unfrozen_after():
    yield
    gc.unfreeze()
    gc.collect()


def test_frozen_cycles_stay_and_later_ones_are_collected(unfrozen_after):
    kept = Node()
    kept_ref = weakref.ref(kept)
    freeze_startup_heap()
    del kept  # garbage now, but frozen
    later = Node()
    later_ref = weakref.ref(later)
    del later

    gc.collect()

    assert gc.get_freeze_count() > 0
    assert kept_ref() is not None and later_ref() is None
