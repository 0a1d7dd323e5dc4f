"""When a request moves off a replica that went away, and where it may not go back to.

A replica that "went away" answered UNAVAILABLE, or broke the decode session the request ran on
(`SessionBrokenError`, itself UNAVAILABLE). The request then starts over through prefill on the
replicas left, as Dynamo's request migration does: prompt plus the tokens already streamed are
prefilled into a new reservation, and the stream carries on with the next token. That is exact,
not approximate, because sampling is a pure function of (seed, position, logits) and the resumed
tokens count as output (engine/sampler.py). Any other failure is the request's own and ends it.

A request migrates at most `limit` times. Each replica that failed it is excluded from its
routing from then on: the registry lists a dead replica until its heartbeat expires, and a
stalled or unreachable one for as long as it heartbeats. The gateway's other requests avoid it
for a back-off too (gateway.disaggregated.outliers).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from pdserve.gateway.disaggregated.backend_errors import BackendError
from pdserve.gateway.disaggregated.outliers import Outliers


class MigrationLimitError(BackendError):
    """The request failed on a replica once more than its migration limit allows (UNAVAILABLE)."""


@dataclass(slots=True)
class Migrations:
    limit: int  # migrations allowed per request; 0 fails it on its first replica failure
    outliers: Outliers = field(default_factory=Outliers)  # the gateway's: every request's failures eject
    num_done: int = 0
    excluded_replica_ids: set[str] = field(default_factory=set)

    @staticmethod
    def failed_replica(error: BaseException) -> str | None:
        """The replica whose going away caused `error`, or None when the request should not move."""
        if isinstance(error, BackendError) and error.grpc_code == grpc.StatusCode.UNAVAILABLE:
            return error.replica_id
        return None

    def start(self, request_id: str, error: BackendError, replica_id: str) -> None:
        """Counts one migration away from `replica_id`, which is ejected from the gateway's routing;
        raises MigrationLimitError past the limit."""
        self.excluded_replica_ids.add(replica_id)
        self.outliers.failed(replica_id)
        if self.num_done >= self.limit:
            raise MigrationLimitError(
                grpc.StatusCode.UNAVAILABLE,
                f"request {request_id}: {error} (migration limit {self.limit} reached)") from error
        self.num_done += 1
