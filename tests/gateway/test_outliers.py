"""Outlier ejection: a failed replica leaves routing for a back-off that doubles while it keeps
failing and starts over once it stops; ejection never leaves a kind with no replica."""
from pdserve.cluster.registry import ReplicaInfo
from pdserve.gateway.disaggregated.outliers import Outliers


class Clock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


D0 = ("d0", "127.0.0.1:1")


def replica(replica_id: str, endpoint: str = "127.0.0.1:1") -> ReplicaInfo:
    return ReplicaInfo(replica_id, "decode", endpoint, "h", "cpu")


def test_a_failed_replica_is_out_of_routing_for_the_base_backoff_then_probed():
    clock = Clock()
    outliers = Outliers(base_s=5.0, max_s=20.0, clock=clock)
    assert outliers.failed(D0) == 5.0
    clock.now_s += 4.9
    assert outliers.ejected() == {D0}
    clock.now_s += 0.2
    assert outliers.ejected() == set()


def test_the_requests_one_fault_fails_at_once_eject_the_replica_once():
    clock = Clock()
    outliers = Outliers(base_s=5.0, max_s=20.0, clock=clock)
    assert [outliers.failed(D0) for _ in range(8)] == [5.0] * 8
    clock.now_s += 5.1
    assert outliers.ejected() == set()


def test_the_backoff_doubles_while_the_replica_keeps_failing_up_to_the_max():
    clock = Clock()
    outliers = Outliers(base_s=5.0, max_s=20.0, clock=clock)
    backoffs = []
    for _ in range(4):
        backoffs.append(outliers.failed(D0))
        clock.now_s += backoffs[-1] + 0.1  # each probe fails as soon as it is let back in
    assert backoffs == [5.0, 10.0, 20.0, 20.0]


def test_a_replica_back_in_routing_for_max_s_without_failing_starts_over_from_the_base():
    clock = Clock()
    outliers = Outliers(base_s=5.0, max_s=20.0, clock=clock)
    outliers.failed(D0)
    clock.now_s += 6.0
    assert outliers.failed(D0) == 10.0
    clock.now_s += 10.0 + 20.0
    assert outliers.ejected() == set()
    assert outliers.failed(D0) == 5.0


def test_usable_leaves_out_the_ejected_unless_that_leaves_none():
    outliers = Outliers(clock=Clock())
    outliers.failed(D0)
    assert [r.replica_id for r in outliers.usable([replica("d0"), replica("d1")])] == ["d1"]
    assert [r.replica_id for r in outliers.usable([replica("d0")])] == ["d0"]


def test_a_replica_restarted_under_the_same_id_on_another_endpoint_is_not_ejected():
    outliers = Outliers(clock=Clock())
    outliers.failed(D0)
    restarted = replica("d0", "127.0.0.1:2")
    assert outliers.usable([restarted, replica("d1")]) == [restarted, replica("d1")]
