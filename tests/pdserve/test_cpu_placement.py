"""`pdserve up` on CPU gives each replica its own cores when there are enough."""
import pytest

from pdserve.engine.engine_args import parse_cpu_list
from pdserve.cpu_placement import cpu_list_arg, split_cpus


@pytest.mark.parametrize("cpus, num_replicas, expected", [
    ([0, 1], 2, [[0], [1]]),
    ([0, 1, 2, 3], 2, [[0, 1], [2, 3]]),
    ([0, 1, 2, 3, 4], 2, [[0, 1, 2], [3, 4]]),
    ([4, 2, 6], 3, [[2], [4], [6]]),
    ([1], 2, [[1], [1]]),
    ([0, 1], 3, [[0], [1], [0]]),
])
def test_sets_are_disjoint_when_they_can_be(cpus, num_replicas, expected):
    assert split_cpus(cpus, num_replicas) == expected


def test_a_cpu_list_round_trips_through_the_flag():
    assert parse_cpu_list(cpu_list_arg([0, 2, 3])) == [0, 2, 3]
    assert parse_cpu_list("0-2,5") == [0, 1, 2, 5]
