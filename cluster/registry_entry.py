"""A replica's registry entry: what it announces (`ReplicaInfo`), and the rules by which a
reader turns the fields of an entry found in Redis into one. Pure: no I/O, the time passed in.
The signature is checked before these rules run (cluster/registry_signing.py).

Besides who the replica is and its load, an entry states:

    protocol_version       the writer's REGISTRY_PROTOCOL_VERSION; 0 in an entry written before
                           entries carried one (the fields of version 1, less those below)
    kv_layout_fingerprint  kvtransfer.layout's fingerprint of the replica's KV blocks: equal for
                           replicas whose blocks are byte-compatible; "" when not stated
    written_unix_s, ttl_s  when the replica wrote the entry (its clock) and for how long it holds
                           unless written again; 0 when not stated

Reading, so that replicas and gateways of neighbouring versions run side by side:

- A field the reader does not know is ignored and the entry used: adding a field is a
  compatible change, and does not bump the version.
- A known field the entry lacks takes its default; an entry without one of the identity fields
  (replica_id, kind, endpoint, host_id, device), or with a field of the wrong type, is not used.
- An entry of a higher protocol version than the reader's is not used: the version goes up only
  when a field changes meaning, and a reader cannot know how to read a meaning it predates.
- An entry written more than ttl_s + max_clock_skew_s ago, or more than max_clock_skew_s ahead
  of the reader's clock, is not used. Redis's TTL bounds the life of a key, but a signed entry
  copied back into Redis later (a replay) still carries the time it was first written. An entry
  that states no written time (version 0) cannot be judged so, and is used.
- An entry stored under another replica's key (kind and id) is not that replica, and not used.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ReplicaKind = Literal["prefill", "decode"]
REGISTRY_PROTOCOL_VERSION = 1
MAX_CLOCK_SKEW_S = 10.0  # how far a replica's clock may run from a gateway's


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    replica_id: str
    kind: ReplicaKind
    endpoint: str  # host:port of the replica's gRPC service
    host_id: str  # equal for two replicas that can share memory (see registry.default_host_id)
    device: str  # "cpu", "cuda:0", ...
    # Load, as last reported; fields a replica does not report stay 0.
    queued_tokens: int = 0  # prompt tokens waiting for or in prefill
    free_blocks: int = 0  # KV blocks not reserved or in use
    total_blocks: int = 0
    block_size: int = 0  # tokens per KV block; 0 when not reported
    running_seqs: int = 0
    waiting_seqs: int = 0
    used_slots: int = 0  # KV slots holding a token (allocated slots minus paging waste)
    num_preemptions: int = 0  # since the replica started
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache, since the replica started
    prefix_cache_hits: int = 0  # of those, tokens found cached
    weights_bytes: int = 0  # the memory the replica's weights take
    kv_pool_bytes: int = 0  # and its KV pool
    resident_bytes: int = 0  # the replica process's resident memory (engine/process_memory.py)
    # What its engine's steps did since the replica started, by kind of step (engine/step_stats.py).
    decode_steps: int = 0
    mixed_steps: int = 0
    prompt_steps: int = 0
    decode_steps_s: float = 0.0  # seconds in those steps
    mixed_steps_s: float = 0.0
    prompt_steps_s: float = 0.0
    computed_prompt_tokens: int = 0
    computed_decode_tokens: int = 0
    updated_unix_s: float = 0.0  # when the replica last reported its load
    # The entry itself (see the module docstring).
    kv_layout_fingerprint: str = ""
    protocol_version: int = 0
    written_unix_s: float = 0.0
    ttl_s: float = 0.0


LOAD_FIELDS = frozenset({"queued_tokens", "free_blocks", "total_blocks", "block_size", "running_seqs", "waiting_seqs",
                         "used_slots", "num_preemptions", "prefix_cache_queries", "prefix_cache_hits",
                         "weights_bytes", "kv_pool_bytes", "resident_bytes", "decode_steps", "mixed_steps",
                         "prompt_steps", "decode_steps_s", "mixed_steps_s", "prompt_steps_s", "computed_prompt_tokens",
                         "computed_decode_tokens"})
_FIELDS = dataclasses.fields(ReplicaInfo)
_REQUIRED_FIELDS = tuple(field.name for field in _FIELDS if field.default is dataclasses.MISSING)
_FIELD_TYPES = {field.name: str if field.name in _REQUIRED_FIELDS else type(field.default) for field in _FIELDS}
_ACCEPTED_TYPES = {str: (str,), int: (int,), float: (int, float)}  # another writer may write 2.0 as 2


class UnusableEntryError(ValueError):
    """A registry entry that is not used; the message says why."""


def read_entry(fields: Mapping[str, object], kind: str, replica_id: str, now_unix_s: float,
               max_clock_skew_s: float = MAX_CLOCK_SKEW_S) -> ReplicaInfo:
    """The replica that the verified `fields` stored under `replica:{kind}:{replica_id}`
    announce; raises UnusableEntryError by the rules of the module docstring."""
    known = {name: value for name, value in fields.items() if name in _FIELD_TYPES}
    wrong_types = sorted(name for name, value in known.items()
                         if isinstance(value, bool) or not isinstance(value, _ACCEPTED_TYPES[_FIELD_TYPES[name]]))
    if wrong_types:
        raise UnusableEntryError(f"fields of the wrong type: {wrong_types}")
    missing = [name for name in _REQUIRED_FIELDS if name not in known]
    if missing:
        raise UnusableEntryError(f"missing fields: {missing}")
    replica = ReplicaInfo(**known)
    if (replica.kind, replica.replica_id) != (kind, replica_id):
        raise UnusableEntryError(f"it names {replica.kind} replica {replica.replica_id!r}: under another replica's key")
    if replica.protocol_version > REGISTRY_PROTOCOL_VERSION:
        raise UnusableEntryError(f"protocol version {replica.protocol_version}, newer than this reader's "
                                 f"{REGISTRY_PROTOCOL_VERSION}")
    if replica.written_unix_s:
        age_s = now_unix_s - replica.written_unix_s
        if not -max_clock_skew_s <= age_s <= replica.ttl_s + max_clock_skew_s:
            raise UnusableEntryError(f"written {age_s:.1f} s ago with a TTL of {replica.ttl_s:g} s: replayed, "
                                     f"or the clocks disagree by over {max_clock_skew_s:g} s")
    return replica
