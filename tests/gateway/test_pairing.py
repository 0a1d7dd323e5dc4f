"""Pairing policy: a decode replica is chosen only beside a prefill replica of the same KV
layout, however attractive its load; with no such pair live the request gets a typed error that
names each replica's layout; a replica that states no layout pairs with any."""
import pytest

from pdserve.cluster.registry import ReplicaInfo
from pdserve.gateway.disaggregated.pairing import IncompatibleReplicasError, pairable_decodes, partners
from pdserve.gateway.disaggregated.router import NoReplicaError, pick_decode, pick_prefill

BLOCK_16 = "a16a16a16a16a16a"  # fingerprints, as kvtransfer.layout makes them: only equality counts
BLOCK_32 = "b32b32b32b32b32b"


def decode(replica_id, fingerprint, free_blocks=100):
    return ReplicaInfo(replica_id, "decode", f"{replica_id}:1", "host", "cpu", free_blocks=free_blocks,
                       total_blocks=1000, block_size=16, kv_layout_fingerprint=fingerprint)


def prefill(replica_id, fingerprint, queued_tokens=0):
    return ReplicaInfo(replica_id, "prefill", f"{replica_id}:1", "host", "cpu", queued_tokens=queued_tokens,
                       kv_layout_fingerprint=fingerprint)


def pick_pair(decodes, prefills):
    """The two picks as the dispatcher makes them."""
    chosen = pick_decode(pairable_decodes(decodes, prefills), 16)
    return chosen.replica_id, pick_prefill(partners(chosen, prefills)).replica_id


def test_a_decode_replica_of_another_layout_is_never_chosen_however_free():
    decodes = [decode("d-other", BLOCK_32, free_blocks=1000), decode("d-same", BLOCK_16, free_blocks=10)]
    assert pick_pair(decodes, [prefill("p0", BLOCK_16)]) == ("d-same", "p0")


def test_the_prefill_replica_is_chosen_among_those_of_the_decode_replicas_layout():
    decodes = [decode("d16", BLOCK_16, free_blocks=10), decode("d32", BLOCK_32, free_blocks=500)]
    prefills = [prefill("p16", BLOCK_16, queued_tokens=0), prefill("p32", BLOCK_32, queued_tokens=900)]
    assert pick_pair(decodes, prefills) == ("d32", "p32")  # the least loaded prefill replica is no partner
    assert partners(decodes[0], prefills) == [prefills[0]]


def test_with_no_pair_of_one_layout_the_error_names_each_replicas_layout():
    with pytest.raises(IncompatibleReplicasError) as raised:
        pairable_decodes([decode("d0", BLOCK_32)], [prefill("p0", BLOCK_16)])
    assert isinstance(raised.value, NoReplicaError)  # the dispatcher fails the request at once with it
    message = str(raised.value)
    assert f"p0 {BLOCK_16}" in message and f"d0 {BLOCK_32}" in message and "--block-size" in message


@pytest.mark.parametrize("prefill_fingerprint, decode_fingerprint", [("", BLOCK_32), (BLOCK_16, ""), ("", "")])
def test_a_replica_that_states_no_layout_pairs_with_any(prefill_fingerprint, decode_fingerprint):
    assert pick_pair([decode("d0", decode_fingerprint)], [prefill("p0", prefill_fingerprint)]) == ("d0", "p0")


def test_no_live_replica_of_a_kind_is_said_as_before():
    assert pairable_decodes([], [prefill("p0", BLOCK_16)]) == []  # pick_decode says "no live decode replica"
    with pytest.raises(NoReplicaError, match="no live prefill replica") as raised:
        pairable_decodes([decode("d0", BLOCK_16)], [])
    assert not isinstance(raised.value, IncompatibleReplicasError)
