"""A core lease (engine/core_lease.py) between a lender and a borrower on one file: the borrower
widens to the lent CPUs (its own thread's affinity and torch's thread count) only while the
lender is idle; the lender, before a step, waits until the borrower has narrowed, but an
unanswering borrower holds it up once, for RECLAIM_TIMEOUT_S, and not again until it answers; a
restarted borrower starts with nothing borrowed."""
import os
import threading
import time

import pytest
import torch

from pdserve.engine import core_lease
from pdserve.engine.core_lease import Borrower, Lender, create_lease

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="lending needs two CPUs")
WAIT_S = 10.0  # for a thread that should finish at once


class EngineThread:
    """A thread standing in for an engine's, running what it is handed, in order."""

    def __init__(self):
        self._calls: list = []
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def run(self, fn) -> tuple[threading.Event, dict]:
        """Hands `fn` over; (set once it has returned, {"value": what it returned})."""
        done = threading.Event()
        result = {}

        def call():
            result["value"] = fn()
            done.set()

        with self._ready:
            self._calls.append(call)
            self._ready.notify()
        return done, result

    def call(self, fn):
        done, result = self.run(fn)
        assert done.wait(WAIT_S)
        return result["value"]

    def stop(self):
        self.call(lambda: None)
        with self._ready:
            self._calls.append(None)
            self._ready.notify()
        self._thread.join(WAIT_S)

    def _run(self):
        while True:
            with self._ready:
                while not self._calls:
                    self._ready.wait()
                call = self._calls.pop(0)
            if call is None:
                return
            call()


@pytest.fixture
def lease(tmp_path):
    threads_before = torch.get_num_threads()
    yield create_lease(tmp_path / "cores")
    torch.set_num_threads(threads_before)


def widths(borrower: Borrower):
    """The borrower's thread's affinity and torch thread count, as seen from that thread."""
    return sorted(os.sched_getaffinity(0)), torch.get_num_threads(), borrower.wide


def test_the_borrower_widens_only_while_the_lender_is_idle(lease):
    own, lent = CPUS[:1], CPUS[1:2]
    lender, engine = Lender(lease), EngineThread()
    try:
        borrower = engine.call(lambda: Borrower(lease, own, lent))
        engine.call(lambda: (os.sched_setaffinity(0, own), torch.set_num_threads(1)))
        assert engine.call(lambda: (borrower.before_step(), widths(borrower))[1]) == (own + lent, 2, True)
        assert sorted(os.sched_getaffinity(0)) == CPUS  # this thread's own is untouched

        reclaim = EngineThread()
        try:
            done, _ = reclaim.run(lender.before_step)
            assert not done.wait(0.05)  # the lender waits while the borrower holds the CPUs
            assert engine.call(lambda: (borrower.before_step(), widths(borrower))[1]) == (own, 1, False)
            assert done.wait(WAIT_S)
            assert engine.call(lambda: (borrower.before_step(), widths(borrower))[1]) == (own, 1, False)
            lender.idle()
            assert engine.call(lambda: (borrower.before_step(), widths(borrower))[1]) == (own + lent, 2, True)
            engine.call(borrower.idle)  # a borrower with no work returns them at once
            start = time.monotonic()
            lender.before_step()
            assert time.monotonic() - start < core_lease.RECLAIM_TIMEOUT_S
        finally:
            reclaim.stop()
    finally:
        engine.stop()


def test_an_unanswering_borrower_holds_the_lender_up_once(lease):
    own, lent = CPUS[:1], CPUS[1:2]
    lender, engine = Lender(lease), EngineThread()
    try:
        borrower = engine.call(lambda: Borrower(lease, own, lent))
        engine.call(borrower.before_step)
        assert borrower.wide
        start = time.monotonic()
        lender.before_step()  # the borrower never steps again: stopped, say
        assert time.monotonic() - start >= core_lease.RECLAIM_TIMEOUT_S
        lender.idle()
        start = time.monotonic()
        lender.before_step()  # not waited for again while it holds them
        assert time.monotonic() - start < core_lease.RECLAIM_TIMEOUT_S
        engine.call(borrower.before_step)  # it answers: narrows, seeing the lender busy
        assert not borrower.wide
        lender.idle()
        engine.call(borrower.before_step)
        reclaim = EngineThread()
        try:
            done, _ = reclaim.run(lender.before_step)
            assert not done.wait(0.05)  # answering again, it is waited for again
            engine.call(borrower.idle)
            assert done.wait(WAIT_S)
        finally:
            reclaim.stop()
    finally:
        engine.stop()


def test_a_restarted_borrower_starts_with_nothing_borrowed(lease):
    own, lent = CPUS[:1], CPUS[1:2]
    engine = EngineThread()
    try:
        engine.call(lambda: Borrower(lease, own, lent).before_step())  # then dies holding the CPUs
        engine.call(lambda: Borrower(lease, own, lent))  # its restart
        start = time.monotonic()
        Lender(lease).before_step()
        assert time.monotonic() - start < core_lease.RECLAIM_TIMEOUT_S
    finally:
        engine.stop()
