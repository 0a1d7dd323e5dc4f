"""HTTP/2 keepalive on every internal gRPC connection, so that a peer that is alive but silent is
found out within a bound.

A process stopped by SIGSTOP, or cut off by a partition, keeps its TCP connections open: calls
to it simply wait, up to whatever deadline they carry. With keepalive each side pings the other
every `interval_s` and closes the connection when a ping goes unanswered for `timeout_s`; every
call on it then fails with UNAVAILABLE, which the gateway treats as the replica going away
(gateway.disaggregated.migration). So a silent peer is noticed within interval_s + timeout_s,
whatever the call's own deadline. Pings are answered by gRPC's own threads, not by the
engine, so a replica busy with a long step still answers them. A channel tries to reconnect at
least every `interval_s` (gRPC's default backoff grows to 2 minutes), so a peer back from a
partition is reachable again within that.

Servers accept pings as often as a client may send them, with or without calls in flight:
gRPC's default server policy ends a connection that pings more often than every 5 minutes
without data ("too_many_pings").
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from pdserve.protocol.errors import InvalidConfigError

DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Keepalive:
    interval_s: float = DEFAULT_INTERVAL_S  # between pings
    timeout_s: float = DEFAULT_TIMEOUT_S  # for a ping's answer before the connection is closed

    def __post_init__(self):
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise InvalidConfigError(f"keepalive needs positive seconds, got interval {self.interval_s} and "
                                     f"timeout {self.timeout_s}")

    def client_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", round(self.interval_s * 1000)),
            ("grpc.keepalive_timeout_ms", round(self.timeout_s * 1000)),
            # Recent gRPC waits for any ping's answer this long (default 1 minute), keepalive's too.
            ("grpc.http2.ping_timeout_ms", round(self.timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_reconnect_backoff_ms", round(self.interval_s * 1000)),
        ]

    def server_options(self) -> list[tuple[str, int]]:
        return [
            *self.client_options(),  # the server pings its callers too: a gone gateway ends its sessions
            ("grpc.http2.min_recv_ping_interval_without_data_ms", round(self.interval_s * 1000 / 2)),
            ("grpc.http2.max_ping_strikes", 0),
        ]


def add_keepalive_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keepalive-s", type=float, default=DEFAULT_INTERVAL_S,
                        help="seconds between keepalive pings on internal gRPC connections")
    parser.add_argument("--keepalive-timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                        help="an internal connection whose ping is not answered in this long is closed, and the "
                             "calls on it fail over (a peer stopped or cut off is found within both)")


def keepalive_from(args: argparse.Namespace) -> Keepalive:
    return Keepalive(args.keepalive_s, args.keepalive_timeout_s)
