"""Which replica serves the next request: pure policy over the live replica set.

Decode: the replica with the most free KV blocks, ties to the fewest running sequences, then to
the smallest replica_id; replicas whose free blocks cannot hold the prompt are passed over while
any replica can. Prefill: the fewest queued prompt tokens, ties to the smallest replica_id.
The dispatcher offers each pick only replicas whose KV layouts match (gateway.disaggregated.pairing).

Cache-aware (gateway.disaggregated.prefix_affinity), the prompt tokens a replica already holds count in its
favour, at the rate of the work they save, as Dynamo's KV router weighs overlap against load:
on prefill they are tokens it will not compute, so its cost is queued tokens minus cached
tokens; on decode they are blocks it will not fill, so they count as free blocks. With no hits
anywhere both rules are the load-only ones above.

Reported load lags the replica by up to one heartbeat, so a burst arriving between two reports
would all land on the same replica. `Router` adds on top of each replica's report what this
gateway sent it since then: a dispatch counts until the replica reports load measured after it
(`updated_unix_s` later than the dispatch; replica and gateway clocks are taken to agree to well
under a heartbeat), or until it is `max_pending_s` old, for a replica that stops reporting.
Until then a dispatch the report already includes is counted twice, which errs toward spreading
load. Other gateways' dispatches are only seen through the reports.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdserve.protocol.errors import PdserveError
from pdserve.protocol.kv_blocks import num_blocks_for

if TYPE_CHECKING:
    from pdserve.cluster.registry import ReplicaInfo


_NONE_CACHED: Mapping[str, int] = MappingProxyType({})


class NoReplicaError(PdserveError, LookupError):
    """No live replica of the kind a request needs."""


def pick_decode(replicas: Sequence[ReplicaInfo], num_prompt_tokens: int,
                cached_tokens: Mapping[str, int] = _NONE_CACHED) -> ReplicaInfo:
    """`cached_tokens`: {replica_id: prompt tokens already in that replica's cache}."""
    if not replicas:
        raise NoReplicaError("no live decode replica")
    usable = {r.replica_id: r.free_blocks + _num_blocks(r, cached_tokens.get(r.replica_id, 0)) for r in replicas}
    fitting = [r for r in replicas if r.block_size == 0 or usable[r.replica_id] >= _num_blocks(r, num_prompt_tokens)]
    return min(fitting or replicas, key=lambda r: (-usable[r.replica_id], r.running_seqs, r.replica_id))


def pick_prefill(replicas: Sequence[ReplicaInfo], cached_tokens: Mapping[str, int] = _NONE_CACHED) -> ReplicaInfo:
    """`cached_tokens`: {replica_id: prompt tokens already in that replica's cache}."""
    if not replicas:
        raise NoReplicaError("no live prefill replica")
    return min(replicas, key=lambda r: (r.queued_tokens - cached_tokens.get(r.replica_id, 0), r.replica_id))


def _num_blocks(replica: ReplicaInfo, num_tokens: int) -> int:
    """Blocks of the replica's size for `num_tokens`; 0 for a replica that reports no block
    size (it cannot be judged, so it is not passed over)."""
    return num_blocks_for(num_tokens, replica.block_size) if replica.block_size else 0


@dataclass(frozen=True, slots=True)
class _Dispatch:
    num_prompt_tokens: int
    unix_s: float


class Router:
    """pick_decode / pick_prefill over reports corrected by this gateway's own recent dispatches."""

    def __init__(self, *, max_pending_s: float = 10.0, clock: Callable[[], float] = time.time):
        self._max_pending_s = max_pending_s
        self._clock = clock  # wall-clock seconds, comparable with the replicas' updated_unix_s
        self._pending: dict[tuple[str, str], list[_Dispatch]] = {}

    def pick_decode(self, replicas: Sequence[ReplicaInfo], num_prompt_tokens: int,
                    cached_tokens: Mapping[str, int] = _NONE_CACHED) -> ReplicaInfo:
        """The chosen replica, with its load as counted here (report plus pending dispatches)."""
        return pick_decode([self._adjusted(replica) for replica in replicas], num_prompt_tokens, cached_tokens)

    def pick_prefill(self, replicas: Sequence[ReplicaInfo],
                     cached_tokens: Mapping[str, int] = _NONE_CACHED) -> ReplicaInfo:
        """The chosen replica, with its load as counted here (report plus pending dispatches)."""
        return pick_prefill([self._adjusted(replica) for replica in replicas], cached_tokens)

    def note_dispatched(self, replica: ReplicaInfo, num_prompt_tokens: int) -> None:
        """Counts a prompt sent to `replica` (queued tokens for prefill, blocks and a sequence
        for decode) until the replica's own report covers it."""
        now_unix_s = self._clock()
        self._pending = {
            key: recent
            for key, dispatches in self._pending.items()
            if (recent := self._recent(dispatches, 0.0, now_unix_s))
        }
        key = (replica.kind, replica.replica_id)
        self._pending.setdefault(key, []).append(_Dispatch(num_prompt_tokens, now_unix_s))

    def _adjusted(self, replica: ReplicaInfo) -> ReplicaInfo:
        key = (replica.kind, replica.replica_id)
        pending = self._recent(self._pending.get(key, []), replica.updated_unix_s, self._clock())
        if not pending:
            self._pending.pop(key, None)
            return replica
        self._pending[key] = pending
        num_tokens = sum(dispatch.num_prompt_tokens for dispatch in pending)
        num_blocks = 0
        if replica.block_size:
            num_blocks = sum(num_blocks_for(d.num_prompt_tokens, replica.block_size) for d in pending)
        return dataclasses.replace(
            replica,
            queued_tokens=replica.queued_tokens + num_tokens,
            free_blocks=max(0, replica.free_blocks - num_blocks),
            running_seqs=replica.running_seqs + len(pending),
        )

    def _recent(self, dispatches: list[_Dispatch], reported_unix_s: float, now_unix_s: float) -> list[_Dispatch]:
        """The dispatches after the report and younger than max_pending_s."""
        return [d for d in dispatches if d.unix_s > reported_unix_s and now_unix_s - d.unix_s < self._max_pending_s]

