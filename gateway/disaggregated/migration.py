"""When a request moves off a replica that failed it, and which replica it may not go back to.

A failed attempt is blamed (`blame`) on one replica, or on none:

    KV transfer failed on the decode side    the decode replica; it is still reachable, so its
      (KVTransferError, from prefill)         reservation is aborted. The prefill replica that
                                              reported it stays eligible with other decode replicas
    UNAVAILABLE from a replica (its decode    that replica: it went away, nothing more is sent there
      session broke, or it stalled)
    anything else                             none: the failure is the request's own and ends it

A blamed failure starts the request over through prefill on the replicas left, as Dynamo's
request migration does: prompt plus the tokens already streamed are prefilled into a new
reservation, and the stream carries on with the next token. That is exact, not approximate,
because sampling is a pure function of (seed, position, logits) and the resumed tokens count as
output (engine/sampler.py).

A request migrates at most `limit` times. Each replica blamed is excluded from its routing from
then on: the registry lists a dead replica until its heartbeat expires, a stalled or unreachable
one for as long as it heartbeats, and a decode replica that fails transfers stays listed. The
gateway's other requests avoid it for a back-off too (gateway.disaggregated.outliers).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from pdserve.gateway.disaggregated.backend_errors import BackendError, KVTransferError
from pdserve.gateway.disaggregated.outliers import Outliers


class MigrationLimitError(BackendError):
    """The request failed on a replica once more than its migration limit allows (UNAVAILABLE)."""


@dataclass(frozen=True, slots=True)
class Blame:
    """The replica a failed attempt is blamed on."""

    replica_id: str
    reason: str  # gateway.front.metrics.MIGRATION_REASONS
    gone: bool  # it went away: no abort is sent there (it could only wait for its timeout)


def blame(error: BaseException, decode_replica_id: str | None, prefill_replica_id: str | None) -> Blame | None:
    """The replica the failed attempt is blamed on (see the module docstring), or None when the
    request should not move. `decode_replica_id`, `prefill_replica_id`: the attempt's replicas,
    None where it had none (no route yet, or a prefill on the decode replica)."""
    if isinstance(error, KVTransferError) and decode_replica_id is not None:
        return Blame(decode_replica_id, "kv_transfer_failed", gone=False)
    if isinstance(error, BackendError) and error.grpc_code == grpc.StatusCode.UNAVAILABLE and error.replica_id:
        kind = "prefill" if error.replica_id == prefill_replica_id else "decode"
        return Blame(error.replica_id, f"{kind}_unavailable", gone=True)
    return None


@dataclass(slots=True)
class Migrations:
    limit: int  # migrations allowed per request; 0 fails it on its first blamed failure
    outliers: Outliers = field(default_factory=Outliers)  # the gateway's: every request's failures eject
    num_done: int = 0
    excluded_replica_ids: set[str] = field(default_factory=set)

    def start(self, request_id: str, error: BackendError, blamed: Blame, endpoint: str) -> None:
        """Counts one migration away from the blamed replica (at `endpoint`), which is ejected from
        the gateway's routing; raises MigrationLimitError past the limit."""
        self.excluded_replica_ids.add(blamed.replica_id)
        self.outliers.failed((blamed.replica_id, endpoint))
        if self.num_done >= self.limit:
            raise MigrationLimitError(
                grpc.StatusCode.UNAVAILABLE,
                f"request {request_id}: {error} (migration limit {self.limit} reached)") from error
        self.num_done += 1
