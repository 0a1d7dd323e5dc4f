"""A Redis lost in the middle of a transaction reads as StateStoreUnavailableError, wherever the
transaction was: redis-py reports a connection lost under WATCH as a WatchError, which must not
reach callers as an internal error or be retried as if another writer had won."""
import asyncio
import os
import signal
import time

import pytest
from redis.asyncio.client import Pipeline

from pdserve.cluster.redis_client import StateStoreUnavailableError, connect_redis
from pdserve.gateway.front.request_state import RequestState
from pdserve.gateway.disaggregated.request_store import RequestStore
from pdserve.redis_process import start_redis

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]


def _kill_and_wait(server, timeout_s: float = 10.0) -> None:
    os.kill(server.pid, signal.SIGKILL)
    deadline_s = time.monotonic() + timeout_s
    while server.exit_code is None:
        assert time.monotonic() < deadline_s, "redis-server did not die"
        time.sleep(0.02)


@pytest.mark.parametrize("method, cut_first", [("watch", False), ("execute", True)],
                         ids=["after-watch", "before-exec"])
def test_redis_killed_while_a_transition_watches_its_record_reads_as_unavailable(
        redis_executable, tmp_path, monkeypatch, method, cut_first):
    server = start_redis(data_dir=tmp_path, executable=redis_executable)
    original = getattr(Pipeline, method)
    cuts = []

    def cut_if_armed():
        if armed:
            cuts.append(method)
            _kill_and_wait(server)

    async def cut_around(self, *args, **kwargs):
        if cut_first:
            cut_if_armed()
        result = await original(self, *args, **kwargs)
        if not cut_first:
            cut_if_armed()
        return result

    monkeypatch.setattr(Pipeline, method, cut_around)
    armed = False

    async def main():
        nonlocal armed
        client = connect_redis(server.url, timeout_s=1.0)
        try:
            store = RequestStore(client, ttl_s=60.0, live_ttl_s=30.0)
            await store.create("r1", prompt_tokens=4)
            armed = True
            with pytest.raises(StateStoreUnavailableError, match="state store"):
                await store.transition("r1", RequestState.PREFILLING)
        finally:
            await client.aclose()

    try:
        asyncio.run(main())
    finally:
        server.stop()
    assert cuts == [method]  # the cut came inside the transaction, once
