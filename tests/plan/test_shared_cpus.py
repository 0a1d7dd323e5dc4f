"""The host's CPUs shared by pinned and floating jobs (planner/shared_cpus.py)."""
import heapq
import itertools

import pytest

from pdserve.planner.shared_cpus import SharedCpus, fair_rates


def test_jobs_alone_on_their_cores_run_at_full_speed():
    assert fair_rates((1, 1), 0) == ((1.0, 1.0), 0.0)
    assert fair_rates((0, 1), 1) == ((0.0, 1.0), 1.0)  # the front takes the idle core
    assert fair_rates((0, 0), 1) == ((0.0, 0.0), 1.0)  # one job, one core at most


def test_the_front_beside_two_busy_engines_takes_a_third_of_the_host():
    pinned, floating = fair_rates((1, 1), 1)
    assert pinned == pytest.approx([2 / 3, 2 / 3]) and floating == pytest.approx(2 / 3)


def test_a_crowded_core_gives_its_jobs_an_equal_share_and_the_front_nothing():
    pinned, floating = fair_rates((3, 0), 2)
    assert pinned == pytest.approx([1 / 3, 0.0]) and floating == pytest.approx(0.5)  # two jobs on the free core
    pinned, floating = fair_rates((2, 1), 1)
    assert pinned == pytest.approx([0.5, 0.5]) and floating == pytest.approx(0.5)


def test_the_rates_use_the_host_and_no_more():
    for num_pinned in ((0, 0), (1, 0), (1, 1), (2, 1), (3, 0), (1, 1, 1), (4, 0, 1), (2, 2, 0, 1)):
        for num_floating in range(5):
            pinned, floating = fair_rates(num_pinned, num_floating)
            used = sum(n * rate for n, rate in zip(num_pinned, pinned)) + num_floating * floating
            assert used <= len(num_pinned) + 1e-9
            assert floating <= 1.0 and all(n * rate <= 1 + 1e-9 for n, rate in zip(num_pinned, pinned))
            # work conserving: the host is full, or every job runs at full speed
            assert used == pytest.approx(len(num_pinned)) or (floating in (0.0, 1.0) and all(
                rate == 1.0 for n, rate in zip(num_pinned, pinned) if n == 1))


class _Clock:
    """A minimal event loop, as the simulation drives SharedCpus."""

    def __init__(self):
        self.events, self.sequence = [], itertools.count()

    def at(self, time_s, action, argument):
        heapq.heappush(self.events, (time_s, next(self.sequence), action, argument))

    def run(self):
        while self.events:
            time_s, _, action, argument = heapq.heappop(self.events)
            action(time_s, argument)


def test_a_step_is_stretched_by_exactly_the_front_work_that_overlaps_it():
    clock, done = _Clock(), {}
    cpus = SharedCpus(2, clock.at)
    cpus.start(0.0, 0.010, lambda t: done.setdefault("prefill", t), core=0)
    cpus.start(0.0, 0.010, lambda t: done.setdefault("decode", t), core=1)
    clock.at(0.002, lambda t, _: cpus.start(t, 0.003, lambda t: done.setdefault("front", t)), None)
    clock.run()
    # from 2 ms the three share two cores at 2/3 each: the front's 3 ms take 4.5 ms, and the
    # engines lose a third of those 4.5 ms, 1.5 ms each
    assert done["front"] == pytest.approx(0.0065)
    assert done["prefill"] == pytest.approx(0.0115) and done["decode"] == pytest.approx(0.0115)


def test_the_front_beside_one_busy_engine_slows_nothing():
    clock, done = _Clock(), {}
    cpus = SharedCpus(2, clock.at)
    cpus.start(0.0, 0.010, lambda t: done.setdefault("decode", t), core=1)
    cpus.start(0.001, 0.004, lambda t: done.setdefault("front", t))
    clock.run()
    assert done == pytest.approx({"decode": 0.010, "front": 0.005})


def test_a_job_started_when_another_ends_sees_the_core_as_it_is_then():
    clock, done = _Clock(), []
    cpus = SharedCpus(1, clock.at)
    cpus.start(0.0, 0.002, lambda t: (done.append(t), cpus.start(t, 0.002, done.append, core=0)), core=0)
    cpus.start(0.0, 0.004, done.append, core=0)
    clock.run()
    # both at 1/2 until 4 ms; then the follow-up and the rest of the long one share until 8 ms
    assert done == pytest.approx([0.004, 0.008, 0.008])


def test_a_core_outside_the_host_is_refused():
    with pytest.raises(ValueError, match="core 2 of 2"):
        SharedCpus(2, _Clock().at).start(0.0, 1.0, lambda t: None, core=2)
