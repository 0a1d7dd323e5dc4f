"""Request records against a real Redis: every record has a TTL from its creation, renewed only
while it is live, and a Redis that cannot be reached is StateStoreUnavailableError."""
import asyncio

import pytest

from pdserve.cluster.redis_client import StateStoreUnavailableError, connect_redis
from pdserve.gateway.front.request_state import RequestState
from pdserve.gateway.disaggregated.request_store import RequestStore
from tests.helpers import free_port

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]

TTL_S = 60.0
LIVE_TTL_S = 0.5
RENEW_LIVE_TTL_S = 1.0
DEADLINE_S = 10.0


def run_with_store(redis_url, scenario, live_ttl_s=LIVE_TTL_S):
    async def main():
        client = connect_redis(redis_url, timeout_s=2.0)
        try:
            return await scenario(RequestStore(client, ttl_s=TTL_S, live_ttl_s=live_ttl_s), client)
        finally:
            await client.aclose()

    return asyncio.run(main())


async def wait_gone(client, key: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while await client.exists(key):
        assert loop.time() < deadline, f"{key} still there after {DEADLINE_S} s"
        await asyncio.sleep(0.05)


def test_a_record_no_gateway_renews_expires_whatever_its_state(redis_url):
    async def scenario(store, client):
        await store.create("queued", prompt_tokens=4)
        await store.create("decoding", prompt_tokens=4)
        for state in (RequestState.PREFILLING, RequestState.TRANSFERRING, RequestState.DECODING):
            await store.transition("decoding", state)
        for key in ("req:queued", "req:queued:history", "req:decoding", "req:decoding:history"):
            await wait_gone(client, key)

    run_with_store(redis_url, scenario)


def test_keep_alive_renews_live_records_and_leaves_ended_ones_their_ttl(redis_url):
    async def scenario(store, client):
        await store.create("live", prompt_tokens=4)
        await store.create("ended", prompt_tokens=4)
        await store.transition("ended", RequestState.ABORTED)
        ended_pttl_ms = await client.pttl("req:ended")
        assert RENEW_LIVE_TTL_S * 1000 < ended_pttl_ms <= TTL_S * 1000
        # Renewed every quarter TTL (as the gateway does) for over two TTLs: still there.
        for _ in range(9):
            assert await store.keep_alive(["live", "ended", "never-created"]) == 1
            await asyncio.sleep(RENEW_LIVE_TTL_S / 4)
        for key in ("req:live", "req:live:history"):
            assert 0 < await client.pttl(key) <= RENEW_LIVE_TTL_S * 1000
        assert (await store.get("live")).state is RequestState.QUEUED
        assert RENEW_LIVE_TTL_S * 1000 < await client.pttl("req:ended") <= ended_pttl_ms
        assert await client.pttl("req:ended:history") > RENEW_LIVE_TTL_S * 1000
        assert await store.keep_alive([]) == 0

    run_with_store(redis_url, scenario, live_ttl_s=RENEW_LIVE_TTL_S)


@pytest.mark.parametrize("call", ["create", "transition", "get", "keep_alive"])
def test_a_redis_that_cannot_be_reached_is_unavailable(call):
    async def main():
        client = connect_redis(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
        store = RequestStore(client)
        calls = {"create": lambda: store.create("r1", 3), "transition": lambda: store.transition("r1", RequestState.ABORTED),
                 "get": lambda: store.get("r1"), "keep_alive": lambda: store.keep_alive(["r1"])}
        try:
            with pytest.raises(StateStoreUnavailableError, match="state store .* unreachable"):
                await asyncio.wait_for(calls[call](), DEADLINE_S)
        finally:
            await client.aclose()

    asyncio.run(main())
