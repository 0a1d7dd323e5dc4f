"""Whom a failed attempt is blamed on: a KV transfer that failed on the decode side is the decode
replica's (still reachable, so it gets the abort), never the prefill replica that reported it;
a replica that answered UNAVAILABLE went away; any other failure is the request's own."""
import grpc
import pytest

from pdserve.gateway.disaggregated.backend_errors import BackendError, KVTransferError, SessionBrokenError
from pdserve.gateway.disaggregated.migration import Blame, MigrationLimitError, Migrations, blame
from pdserve.gateway.front.metrics import MIGRATION_REASONS

Code = grpc.StatusCode


def test_a_kv_transfer_failed_on_the_decode_side_blames_the_decode_replica_not_the_prefill_that_reported_it():
    reported = KVTransferError(Code.UNAVAILABLE, "p0: KV push of request r1 to d0:9 failed", "p0")
    assert blame(reported, "d0", "p0") == Blame("d0", "kv_transfer_failed", gone=False)


@pytest.mark.parametrize(("error", "expected"), [
    (BackendError(Code.UNAVAILABLE, "p0: socket closed", "p0"), Blame("p0", "prefill_unavailable", gone=True)),
    (BackendError(Code.UNAVAILABLE, "d0: connection refused", "d0"), Blame("d0", "decode_unavailable", gone=True)),
    (SessionBrokenError("d0", "decode replica d0: session broke"), Blame("d0", "decode_unavailable", gone=True)),
])
def test_a_replica_that_answered_unavailable_went_away(error, expected):
    assert blame(error, "d0", "p0") == expected


def test_a_decode_replica_unreachable_before_the_attempt_had_a_route_is_blamed_as_decode():
    refused_reserve = BackendError(Code.UNAVAILABLE, "d1: connection refused", "d1")
    assert blame(refused_reserve, None, None) == Blame("d1", "decode_unavailable", gone=True)


@pytest.mark.parametrize("error", [
    BackendError(Code.RESOURCE_EXHAUSTED, "d0: out of blocks", "d0"),
    BackendError(Code.INTERNAL, "p0: expected first_token", "p0"),
    BackendError(Code.UNAVAILABLE, "decided by the gateway itself"),
    RuntimeError("not a replica's answer"),
])
def test_any_other_failure_is_the_requests_own(error):
    assert blame(error, "d0", "p0") is None


def test_every_reason_blamed_is_a_migration_metric_label():
    errors = [KVTransferError(Code.UNAVAILABLE, "p0: push failed", "p0"),
              BackendError(Code.UNAVAILABLE, "p0: gone", "p0"), BackendError(Code.UNAVAILABLE, "d0: gone", "d0")]
    assert {blame(error, "d0", "p0").reason for error in errors} == set(MIGRATION_REASONS)


def test_each_blamed_replica_is_excluded_and_the_limit_counts_migrations():
    migrations = Migrations(limit=1)
    error = KVTransferError(Code.UNAVAILABLE, "p0: push failed", "p0")
    migrations.start("r1", error, blame(error, "d0", "p0"), "127.0.0.1:1")
    assert migrations.excluded_replica_ids == {"d0"} and migrations.num_done == 1
    with pytest.raises(MigrationLimitError, match="migration limit 1"):
        migrations.start("r1", error, blame(error, "d1", "p0"), "127.0.0.1:2")
    assert migrations.excluded_replica_ids == {"d0", "d1"}
