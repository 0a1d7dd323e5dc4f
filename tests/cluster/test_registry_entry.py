"""Reading a registry entry, as a specification: fields the reader does not know are ignored and
the entry used; an entry of a newer protocol version, one written too long ago (a replay) or too
far ahead of the reader's clock, one lacking who the replica is, or one under another replica's
key is not used, and the reason says why."""
import dataclasses

import pytest

from pdserve.cluster.registry_entry import (REGISTRY_PROTOCOL_VERSION, ReplicaInfo, UnusableEntryError,
                                            read_entry)

NOW_UNIX_S = 1_000_000.0
TTL_S = 3.0
SKEW_S = 10.0


def written(**overrides) -> dict:
    """The fields a replica of this version writes, at NOW_UNIX_S unless overridden."""
    info = ReplicaInfo("d0", "decode", "127.0.0.1:7001", "host-a", "cpu", free_blocks=40, block_size=16,
                       kv_layout_fingerprint="0123456789abcdef", protocol_version=REGISTRY_PROTOCOL_VERSION,
                       written_unix_s=NOW_UNIX_S, ttl_s=TTL_S)
    return {**dataclasses.asdict(info), **overrides}


def read(fields: dict, now_unix_s: float = NOW_UNIX_S) -> ReplicaInfo:
    return read_entry(fields, "decode", "d0", now_unix_s, SKEW_S)


def test_an_entry_reads_back_as_the_replica_that_wrote_it():
    assert dataclasses.asdict(read(written())) == written()


def test_fields_the_reader_does_not_know_are_ignored_and_the_entry_used():
    replica = read(written(kv_pool_tier="host-dram", supports={"speculative": True}))
    assert (replica.replica_id, replica.endpoint, replica.free_blocks) == ("d0", "127.0.0.1:7001", 40)


def test_an_entry_from_before_versions_is_used_with_defaults_for_what_it_lacks():
    old = {name: value for name, value in written().items()
           if name not in {"kv_layout_fingerprint", "protocol_version", "written_unix_s", "ttl_s"}}
    replica = read(old, now_unix_s=NOW_UNIX_S + 3600)  # states no written time: not judged by age
    assert (replica.protocol_version, replica.kv_layout_fingerprint, replica.written_unix_s) == (0, "", 0.0)
    assert replica.free_blocks == 40


def test_an_entry_of_a_newer_protocol_version_is_not_used():
    assert read(written(protocol_version=REGISTRY_PROTOCOL_VERSION)).protocol_version == REGISTRY_PROTOCOL_VERSION
    with pytest.raises(UnusableEntryError, match=f"protocol version {REGISTRY_PROTOCOL_VERSION + 1}, newer"):
        read(written(protocol_version=REGISTRY_PROTOCOL_VERSION + 1))


@pytest.mark.parametrize("age_s, used", [
    (0.0, True),
    (TTL_S + SKEW_S, True),  # the oldest a live entry can look, the clocks apart by the most allowed
    (TTL_S + SKEW_S + 0.5, False),  # replayed, or the clocks apart by more than allowed
    (3600.0, False),
    (-SKEW_S, True),  # the writer's clock ahead by the most allowed
    (-SKEW_S - 0.5, False),
])
def test_an_entry_is_used_only_while_fresh_by_the_readers_clock(age_s, used):
    fields = written(written_unix_s=NOW_UNIX_S - age_s)
    if used:
        assert read(fields).replica_id == "d0"
    else:
        with pytest.raises(UnusableEntryError, match="replayed, or the clocks disagree"):
            read(fields)


@pytest.mark.parametrize("fields, reason", [
    ({name: value for name, value in written().items() if name != "endpoint"}, r"missing fields: \['endpoint'\]"),
    (written(free_blocks="40"), r"wrong type: \['free_blocks'\]"),
    (written(protocol_version=True), r"wrong type: \['protocol_version'\]"),
    (written(replica_id="d1"), "under another replica's key"),
    (written(kind="prefill"), "under another replica's key"),
])
def test_an_entry_that_does_not_say_who_the_replica_is_is_not_used(fields, reason):
    with pytest.raises(UnusableEntryError, match=reason):
        read(fields)


def test_a_float_field_takes_an_integer():
    assert read(written(ttl_s=3, written_unix_s=int(NOW_UNIX_S))).ttl_s == 3
