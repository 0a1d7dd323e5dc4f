"""What the gateway holds per replica: one gRPC channel per endpoint, presenting the gateway's
internal credentials (the deployment secret, its caller id), and one `DecodeClient` (its
session) per decode replica, each opened on first use.

Invariant: a channel or session is closed only once its replica (replica id and endpoint) is
not in the registry's latest listing and nothing uses it any more: no request's current attempt
(the caller's `in_use`), and no call made under `held`. So a draining replica, which leaves the
registry first and then finishes what it runs, keeps serving its requests, and what a replica
that left took here is freed at the first `forget_gone` after its last request ended. A later
request to the same replica opens it again.
"""
from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import grpc

from pdserve.cluster.grpc_server import message_size_options
from pdserve.cluster.internal_auth import InternalAuth
from pdserve.gateway.disaggregated.replica_clients import DecodeClient, PrefillClient, Timeouts
from pdserve.protocol.message_limits import MAX_MESSAGE_BYTES

ReplicaKey = tuple[str, str]  # (replica id, endpoint)


class ReplicaLinks:
    def __init__(self, auth: InternalAuth, timeouts: Timeouts):
        self._auth = auth
        self._timeouts = timeouts
        self._channels: dict[str, grpc.aio.Channel] = {}  # endpoint -> its channel
        self._decode_clients: dict[ReplicaKey, DecodeClient] = {}
        self._held: collections.Counter[ReplicaKey] = collections.Counter()

    @property
    def endpoints(self) -> set[str]:
        """The endpoints a channel is open to."""
        return set(self._channels)

    def decode(self, replica_id: str, endpoint: str) -> DecodeClient:
        """The decode replica's client, the same one for all its requests (they share its session)."""
        key = replica_id, endpoint
        if key not in self._decode_clients:
            self._decode_clients[key] = DecodeClient(replica_id, endpoint, self._channel(endpoint), self._timeouts)
        return self._decode_clients[key]

    def prefill(self, replica_id: str, endpoint: str) -> PrefillClient:
        return PrefillClient(replica_id, endpoint, self._channel(endpoint), self._timeouts)

    @contextlib.contextmanager
    def held(self, replica_id: str, endpoint: str) -> Iterator[None]:
        """Keeps the replica's channel and session open while the block runs."""
        key = replica_id, endpoint
        self._held[key] += 1
        try:
            yield
        finally:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]

    async def forget_gone(self, live: set[ReplicaKey], in_use: set[ReplicaKey]) -> None:
        """Closes the sessions and channels of replicas neither `live` (the registry's listing)
        nor `in_use` nor held; the others stay open."""
        keep = live | in_use | self._held.keys()
        for key in [key for key in self._decode_clients if key not in keep]:
            self._decode_clients.pop(key).close()
        kept_endpoints = {endpoint for _, endpoint in keep}
        for endpoint in [endpoint for endpoint in self._channels if endpoint not in kept_endpoints]:
            await self._channels.pop(endpoint).close()

    async def close(self) -> None:
        """Closes every session and channel, held or not (the gateway is stopping)."""
        for client in self._decode_clients.values():
            client.close()
        self._decode_clients.clear()
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        if endpoint not in self._channels:
            self._channels[endpoint] = self._auth.channel(endpoint, options=message_size_options(MAX_MESSAGE_BYTES))
        return self._channels[endpoint]
