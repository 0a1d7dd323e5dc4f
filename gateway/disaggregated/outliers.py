"""Outlier ejection: replicas this gateway saw fail are kept out of its routing for a while.

The registry lists a replica as long as it heartbeats into Redis, which says nothing of whether
this gateway can reach it or whether it serves: a replica cut off from the gateway but not from
Redis, or one whose engine stalled, stays listed. So every replica that a request had to move
away from (gateway.disaggregated.migration) is ejected here for a back-off: `base_s` after its
first failure, doubled (up to `max_s`) for each failure that comes less than `max_s` after the
previous ejection ended. Failures while it is out (the many requests one fault hits at once) add
nothing. Once the back-off ends, the next request routed to it is the probe: if
it fails, the replica is ejected again for twice as long; a replica back in routing for `max_s`
without failing starts again from `base_s`, as Envoy's outlier detection does.

A replica is known by its id and endpoint: one restarted under the same id (`pdserve up`'s
supervisor does that) on a fresh port is a new process, and starts with a clean slate.

Ejection narrows the choice, it never empties it: where every live replica of a kind is ejected,
routing uses them all (`usable`), since a request can only be served by some replica.

Pure policy: the clock is injected and nothing here awaits.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdserve.cluster.registry import ReplicaInfo

DEFAULT_BASE_S = 5.0
DEFAULT_MAX_S = 20.0
ReplicaKey = tuple[str, str]  # (replica id, endpoint)


@dataclass(frozen=True, slots=True)
class _Ejection:
    until_s: float  # out of routing until then
    backoff_s: float


class Outliers:
    def __init__(self, base_s: float = DEFAULT_BASE_S, max_s: float = DEFAULT_MAX_S,
                 clock: Callable[[], float] = time.monotonic):
        self._base_s = base_s
        self._max_s = max_s
        self._clock = clock
        self._ejections: dict[ReplicaKey, _Ejection] = {}

    def failed(self, replica: ReplicaKey) -> float:
        """Ejects the replica after a failure; returns for how many more seconds it is out."""
        now_s = self._clock()
        previous = self._ejections.get(replica)
        if previous is not None and now_s < previous.until_s:
            return previous.until_s - now_s
        backoff_s = self._base_s
        if previous is not None and now_s - previous.until_s < self._max_s:
            backoff_s = min(self._max_s, 2 * previous.backoff_s)
        self._ejections[replica] = _Ejection(now_s + backoff_s, backoff_s)
        return backoff_s

    def ejected(self) -> set[ReplicaKey]:
        """The replicas out of routing now; forgets those back in routing for max_s."""
        now_s = self._clock()
        self._ejections = {replica: e for replica, e in self._ejections.items() if now_s - e.until_s < self._max_s}
        return {replica for replica, e in self._ejections.items() if now_s < e.until_s}

    def usable(self, replicas: Sequence[ReplicaInfo]) -> list[ReplicaInfo]:
        """`replicas` less the ejected ones, or all of them where that would leave none."""
        ejected = self.ejected()
        kept = [r for r in replicas if (r.replica_id, r.endpoint) not in ejected]
        return kept or list(replicas)
