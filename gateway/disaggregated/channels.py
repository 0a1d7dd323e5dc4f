"""One gRPC channel per replica endpoint, opened on first use and closed with the gateway; each
presents the gateway's internal credentials (the deployment secret, its caller id)."""
from __future__ import annotations

import grpc

from pdserve.cluster.grpc_server import message_size_options
from pdserve.cluster.internal_auth import InternalAuth
from pdserve.protocol.message_limits import MAX_MESSAGE_BYTES


class ChannelPool:
    def __init__(self, auth: InternalAuth | None = None):
        self._auth = auth or InternalAuth.open()
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, endpoint: str) -> grpc.aio.Channel:
        if endpoint not in self._channels:
            self._channels[endpoint] = self._auth.channel(endpoint, options=message_size_options(MAX_MESSAGE_BYTES))
        return self._channels[endpoint]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
