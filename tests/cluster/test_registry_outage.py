"""The gateway's view of the registry while Redis is down: the last set it read, for up to
stale_limit_s, then (or with none read yet) StateStoreUnavailableError, never a raw Redis error."""
import asyncio
import contextlib
import os
import signal
import time

import pytest
from redis.exceptions import RedisError

from pdserve.cluster.redis_client import StateStoreUnavailableError, connect_redis
from pdserve.cluster.registry import LiveReplicas, ReplicaHeartbeat
from pdserve.redis_process import start_redis

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]


def test_while_redis_is_down_the_last_replica_set_is_kept_then_refused(redis_executable, tmp_path):
    server = start_redis(data_dir=tmp_path, executable=redis_executable)

    async def main():
        heartbeat = ReplicaHeartbeat(server.url, "decode", "d0", "127.0.0.1:5000", "host-a", "cpu",
                                     ttl_s=1.0, interval_s=0.2)
        client = connect_redis(server.url, timeout_s=1.0)
        await heartbeat.start()
        try:
            kept, strict = LiveReplicas(client, stale_limit_s=60.0), LiveReplicas(client, stale_limit_s=0.0)
            assert [r.replica_id for r in await kept.list("decode")] == ["d0"]
            assert [r.replica_id for r in await strict.list("decode")] == ["d0"]
            os.kill(server.pid, signal.SIGKILL)
            deadline_s = time.monotonic() + 10.0
            while server.exit_code is None:
                assert time.monotonic() < deadline_s, "redis-server did not die"
                await asyncio.sleep(0.05)

            assert [r.replica_id for r in await kept.list("decode")] == ["d0"]
            for live in (strict, LiveReplicas(client)):  # too old a set, and none read yet
                with pytest.raises(StateStoreUnavailableError, match="state store"):
                    await live.list("decode")
        finally:
            with contextlib.suppress(RedisError):  # deregistering needs the Redis that is gone
                await heartbeat.stop()
            await client.aclose()

    try:
        asyncio.run(main())
    finally:
        server.stop()
