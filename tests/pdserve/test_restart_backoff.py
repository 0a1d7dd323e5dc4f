"""The delay before `pdserve up` restarts a child: 1 s, doubling to 30 s, reset by serving a while."""
from pdserve.supervisor import Backoff


def test_first_restart_waits_the_initial_delay():
    assert Backoff().next_delay_s(None, served_s=0.0) == 1.0


def test_delay_doubles_while_the_child_keeps_failing_and_stops_at_the_cap():
    backoff, delay_s, delays_s = Backoff(), None, []
    for _ in range(8):
        delay_s = backoff.next_delay_s(delay_s, served_s=5.0)
        delays_s.append(delay_s)
    assert delays_s == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_serving_long_enough_makes_the_next_failure_count_as_a_first():
    backoff = Backoff(reset_after_s=60.0)
    assert backoff.next_delay_s(16.0, served_s=59.0) == 30.0
    assert backoff.next_delay_s(16.0, served_s=60.0) == 1.0
