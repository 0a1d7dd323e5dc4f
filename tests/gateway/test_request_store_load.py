"""Under more concurrent request lifecycles than the pool has connections, every store call
queues for a connection and succeeds: load makes calls wait, never fail."""
import asyncio

import pytest

from pdserve.cluster.redis_client import connect_redis
from pdserve.gateway.front.request_state import RequestState
from pdserve.gateway.disaggregated.request_store import RequestStore

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]

NUM_CONNECTIONS = 2
NUM_REQUESTS = 512  # each lifecycle is six transactions: the queue for a connection is thousands long
REPLY_TIMEOUT_S = 0.25  # far shorter than the whole burst takes, so a queue bounded by it would fail
LIFECYCLE = (RequestState.PREFILLING, RequestState.TRANSFERRING, RequestState.DECODING, RequestState.FINISHED)


def test_a_burst_of_lifecycles_beyond_the_pool_size_all_complete(redis_url):
    async def lifecycle(store: RequestStore, request_id: str) -> RequestState:
        await store.create(request_id, prompt_tokens=8)
        for state in LIFECYCLE:
            await store.transition(request_id, state)
        await store.update(request_id, completion_tokens=4)
        return (await store.get(request_id)).state

    async def burst() -> list:
        client = connect_redis(redis_url, timeout_s=REPLY_TIMEOUT_S, max_connections=NUM_CONNECTIONS)
        try:
            store = RequestStore(client)
            return await asyncio.gather(
                *(lifecycle(store, f"r{i}") for i in range(NUM_REQUESTS)), return_exceptions=True)
        finally:
            await client.aclose()

    results = asyncio.run(burst())

    failures = [result for result in results if isinstance(result, BaseException)]
    assert failures == []
    assert results == [RequestState.FINISHED] * NUM_REQUESTS
