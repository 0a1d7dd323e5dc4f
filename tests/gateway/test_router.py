"""Routing policy: decode by free KV blocks, prefill by queued tokens, cached prompt tokens
weighed against both, and a burst between two load reports spread by the gateway's own count of
what it dispatched."""
import itertools

import pytest

from pdserve.cluster.registry import ReplicaInfo
from pdserve.protocol.errors import PdserveError
from pdserve.gateway.disaggregated.router import NoReplicaError, Router, pick_decode, pick_prefill


def decode(replica_id, free_blocks, running_seqs=0, block_size=16, updated_unix_s=0.0):
    return ReplicaInfo(
        replica_id, "decode", f"{replica_id}:1", "host", "cpu",
        free_blocks=free_blocks, total_blocks=1000, block_size=block_size,
        running_seqs=running_seqs, updated_unix_s=updated_unix_s,
    )


def prefill(replica_id, queued_tokens, updated_unix_s=0.0):
    return ReplicaInfo(
        replica_id, "prefill", f"{replica_id}:1", "host", "cpu",
        queued_tokens=queued_tokens, updated_unix_s=updated_unix_s,
    )


class FakeClock:
    def __init__(self, now_unix_s=100.0):
        self.now_unix_s = now_unix_s

    def __call__(self):
        return self.now_unix_s


def test_decode_goes_to_the_most_free_blocks():
    assert pick_decode([decode("a", 10), decode("b", 30), decode("c", 20)], 16).replica_id == "b"


def test_decode_ties_go_to_fewest_running_then_smallest_id_whatever_the_order():
    replicas = [decode("c", 30, running_seqs=2), decode("b", 30, running_seqs=1), decode("a", 30, running_seqs=1)]
    for order in itertools.permutations(replicas):
        assert pick_decode(order, 16).replica_id == "a"


def test_decode_passes_over_replicas_that_cannot_hold_the_prompt_while_one_can():
    many_small = decode("many-small", free_blocks=12, block_size=16)  # 192 tokens
    fewer_large = decode("fewer-large", free_blocks=10, block_size=32)  # 320 tokens
    assert pick_decode([many_small, fewer_large], 250).replica_id == "fewer-large"
    assert pick_decode([many_small, fewer_large], 150).replica_id == "many-small"


def test_decode_falls_back_to_most_free_blocks_when_none_can_hold_the_prompt():
    assert pick_decode([decode("a", 2), decode("b", 3)], 1000).replica_id == "b"


def test_prefill_goes_to_fewest_queued_tokens_ties_to_smallest_id():
    assert pick_prefill([prefill("a", 500), prefill("b", 100), prefill("c", 300)]).replica_id == "b"
    assert pick_prefill([prefill("c", 100), prefill("b", 100), prefill("a", 200)]).replica_id == "b"


@pytest.mark.parametrize("pick, message", [
    (lambda: pick_decode([], 16), "no live decode replica"),
    (lambda: pick_prefill([]), "no live prefill replica"),
    (lambda: Router().pick_decode([], 16), "no live decode replica"),
])
def test_no_live_replica_is_a_typed_error(pick, message):
    with pytest.raises(NoReplicaError, match=message) as raised:
        pick()
    assert isinstance(raised.value, PdserveError)


def test_a_decode_burst_between_reports_spreads_over_equal_replicas():
    router = Router(clock=FakeClock())
    replicas = [decode("a", 100), decode("b", 100)]
    picked = []
    for _ in range(4):
        replica = router.pick_decode(replicas, 64)  # 4 blocks each
        router.note_dispatched(replica, 64)
        picked.append(replica.replica_id)
    assert picked == ["a", "b", "a", "b"]
    assert router.pick_decode(replicas, 64).free_blocks == 100 - 2 * 4


def test_a_prefill_burst_fills_the_least_queued_replica_up_to_the_others():
    router = Router(clock=FakeClock())
    replicas = [prefill("a", 0), prefill("b", 250)]
    picked = []
    for _ in range(4):
        replica = router.pick_prefill(replicas)
        router.note_dispatched(replica, 100)
        picked.append(replica.replica_id)
    assert picked == ["a", "a", "a", "b"]


def test_a_report_measured_after_a_dispatch_replaces_the_gateway_count():
    clock = FakeClock(100.0)
    router = Router(clock=clock)
    router.note_dispatched(decode("a", 100), 64)
    assert router.pick_decode([decode("a", 100, updated_unix_s=99.0)], 64).free_blocks == 96  # stale report
    reported = decode("a", 96, running_seqs=1, updated_unix_s=100.5)  # the replica counted it
    assert router.pick_decode([reported], 64) == reported


def test_a_dispatch_stops_counting_after_max_pending_s_without_a_report():
    clock = FakeClock(100.0)
    router = Router(max_pending_s=10.0, clock=clock)
    router.note_dispatched(prefill("a", 0), 500)
    clock.now_unix_s = 109.0
    assert router.pick_prefill([prefill("a", 0)]).queued_tokens == 500
    clock.now_unix_s = 111.0
    assert router.pick_prefill([prefill("a", 0)]).queued_tokens == 0


def test_prefill_and_decode_replicas_with_the_same_id_are_counted_apart():
    router = Router(clock=FakeClock())
    router.note_dispatched(prefill("r0", 0), 500)
    assert router.pick_decode([decode("r0", 100)], 16).free_blocks == 100
    assert router.pick_prefill([prefill("r0", 0)]).queued_tokens == 500


def test_prefill_weighs_the_tokens_a_replica_holds_cached_against_its_queue():
    replicas = [prefill("a", 100), prefill("b", 400)]
    assert pick_prefill(replicas).replica_id == "a"
    assert pick_prefill(replicas, {"b": 256}).replica_id == "a"  # saves less than its extra queue
    assert pick_prefill(replicas, {"b": 320}).replica_id == "b"  # saves more than its extra queue


def test_decode_counts_cached_prompt_blocks_as_free_ones():
    replicas = [decode("a", 40), decode("b", 30)]
    assert pick_decode(replicas, 160).replica_id == "a"
    assert pick_decode(replicas, 160, {"b": 16 * 11}).replica_id == "b"  # 30 + 11 blocks beat 40
    tight = [decode("a", 4), decode("b", 8)]  # only "a" holds the 10-block prompt, thanks to its cache
    assert pick_decode(tight, 160, {"a": 16 * 8}).replica_id == "a"
