"""Which prefill and decode replicas may serve one request together: those whose KV blocks are
byte-compatible, as the KV layout fingerprints of their registry entries say (kvtransfer.layout:
model, dtype, layers, KV heads, head dim, block size, layout version).

Any other pair fails every transfer between them with FAILED_PRECONDITION, so none is formed:
during an upgrade, or beside replicas started with another --block-size or --dtype, a decode
replica is paired only with prefill replicas of its own layout, and one that matches no live
prefill replica gets no request. When both kinds are live but no pair matches, the request fails
at once with `IncompatibleReplicasError` (UNAVAILABLE, naming each replica's layout) rather than
wait. A replica whose entry states no fingerprint (written before entries carried one) pairs with
any, as before; the transfer's own layout handshake still checks such a pair.

Pure policy over registry entries: no I/O.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pdserve.gateway.disaggregated.router import NoReplicaError

if TYPE_CHECKING:
    from pdserve.cluster.registry import ReplicaInfo


class IncompatibleReplicasError(NoReplicaError):
    """Prefill and decode replicas are live, but no prefill replica shares a KV layout with a
    decode replica."""


def compatible(prefill: ReplicaInfo, decode: ReplicaInfo) -> bool:
    """Whether KV computed on `prefill` can be written into `decode`'s blocks."""
    fingerprints = prefill.kv_layout_fingerprint, decode.kv_layout_fingerprint
    return "" in fingerprints or fingerprints[0] == fingerprints[1]


def pairable_decodes(decodes: Sequence[ReplicaInfo], prefills: Sequence[ReplicaInfo]) -> list[ReplicaInfo]:
    """The decode replicas that share a KV layout with some prefill replica (none when no decode
    replica is live). Raises NoReplicaError when no prefill replica is live, and
    IncompatibleReplicasError when none shares a layout with a decode replica."""
    if not decodes:
        return []
    if not prefills:
        raise NoReplicaError("no live prefill replica")
    pairable = [decode for decode in decodes if any(compatible(prefill, decode) for prefill in prefills)]
    if not pairable:
        raise IncompatibleReplicasError(
            f"no live prefill replica shares a KV layout with a live decode replica (prefill: {_layouts(prefills)}; "
            f"decode: {_layouts(decodes)}): start them with the same model, --dtype and --block-size")
    return pairable


def partners(decode: ReplicaInfo, prefills: Sequence[ReplicaInfo]) -> list[ReplicaInfo]:
    """The prefill replicas that may prefill for `decode`."""
    return [prefill for prefill in prefills if compatible(prefill, decode)]


def _layouts(replicas: Sequence[ReplicaInfo]) -> str:
    return ", ".join(f"{replica.replica_id} {replica.kv_layout_fingerprint}" for replica in replicas)
