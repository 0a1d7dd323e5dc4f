"""One gRPC channel per replica endpoint, opened on first use and closed with the gateway; each
presents the gateway's internal credentials (the deployment secret, its caller id)."""
from __future__ import annotations

import grpc

from pdserve.cluster.grpc_server import MAX_MESSAGE_BYTES
from pdserve.cluster.internal_auth import InternalAuth


class ChannelPool:
    def __init__(self, auth: InternalAuth | None = None):
        self._auth = auth or InternalAuth.open()
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, endpoint: str) -> grpc.aio.Channel:
        if endpoint not in self._channels:
            self._channels[endpoint] = self._auth.channel(endpoint, options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ])
        return self._channels[endpoint]

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
