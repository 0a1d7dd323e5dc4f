"""`pdserve up --device cuda` gives each replica its own GPU when there are enough, and takes
explicit lists only when they name one existing GPU per replica."""
import pytest

from pdserve.gpu_placement import PlacementError, place_replicas


@pytest.mark.parametrize("num_prefill, num_decode, num_gpus, expected", [
    (1, 1, 2, ([0], [1])),
    (2, 2, 4, ([0, 1], [2, 3])),
    (1, 3, 8, ([0], [1, 2, 3])),
    (2, 2, 3, ([0, 1], [2, 0])),
    (1, 1, 1, ([0], [0])),
])
def test_each_replica_has_its_own_gpu_while_there_are_enough(num_prefill, num_decode, num_gpus, expected):
    assert place_replicas(num_prefill, num_decode, num_gpus) == expected


def test_explicit_lists_win_and_an_unnamed_kind_takes_the_gpus_left_free():
    assert place_replicas(2, 2, 4, prefill_gpus=[3, 2], decode_gpus=[0, 1]) == ([3, 2], [0, 1])
    assert place_replicas(1, 3, 4, decode_gpus=[1, 2, 3]) == ([0], [1, 2, 3])
    assert place_replicas(2, 1, 4, prefill_gpus=[0, 1]) == ([0, 1], [2])
    assert place_replicas(1, 2, 2, prefill_gpus=[0], decode_gpus=[1, 1]) == ([0], [1, 1])
    assert place_replicas(1, 1, 1, decode_gpus=[0]) == ([0], [0])


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_gpus=0), "no CUDA device"),
    (dict(num_gpus=2, decode_gpus=[2]), "GPUs 0..1"),
    (dict(num_gpus=4, prefill_gpus=[0, 1]), "2 GPUs for 1 replicas"),
])
def test_gpus_that_do_not_exist_or_do_not_match_the_replicas_are_refused(kwargs, message):
    with pytest.raises(PlacementError, match=message):
        place_replicas(1, 1, **kwargs)
