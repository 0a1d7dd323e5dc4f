"""The request store as a specification: records follow the lifecycle atomically, keep their
history, expire `live_ttl_s` after their gateway last renewed them, and `ttl_s` after they end."""
import asyncio
import time

import pytest

from pdserve.cluster.redis_client import connect_redis
from pdserve.protocol.errors import IllegalTransitionError
from pdserve.gateway.front.request_state import RequestState
from pdserve.gateway.disaggregated.request_store import RequestExistsError, RequestNotFoundError, RequestStore

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]

TTL_S = 60.0
LIVE_TTL_S = 30.0


def run_with_store(redis_url, scenario, ttl_s=TTL_S, live_ttl_s=LIVE_TTL_S):
    async def main():
        client = connect_redis(redis_url, timeout_s=2.0)
        try:
            return await scenario(RequestStore(client, ttl_s=ttl_s, live_ttl_s=live_ttl_s), client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_new_request_is_queued_with_its_prompt_size_and_empty_fields(redis_url):
    async def scenario(store, client):
        before_unix_s = time.time()
        await store.create("r1", prompt_tokens=42)
        after_unix_s = time.time()
        record = await store.get("r1")
        assert record.request_id == "r1"
        assert record.state is RequestState.QUEUED
        assert (record.prompt_tokens, record.completion_tokens, record.kv_bytes, record.kv_transfer_s) == (42, 0, 0, 0.0)
        assert (record.prefill_replica, record.decode_replica, record.transport, record.error) == ("", "", "", "")
        assert before_unix_s <= record.created_unix_s <= after_unix_s
        assert record.history == ((RequestState.QUEUED, record.created_unix_s),)
        for key in ("req:r1", "req:r1:history"):  # a live request expires unless its gateway renews it
            assert 0 < await client.ttl(key) <= LIVE_TTL_S

    run_with_store(redis_url, scenario)


def test_an_id_in_use_cannot_be_created_again(redis_url):
    async def scenario(store, client):
        await store.create("r1", prompt_tokens=5)
        await store.transition("r1", RequestState.PREFILLING)
        with pytest.raises(RequestExistsError, match="r1"):
            await store.create("r1", prompt_tokens=9)
        record = await store.get("r1")
        assert (record.state, record.prompt_tokens, len(record.history)) == (RequestState.PREFILLING, 5, 2)

    run_with_store(redis_url, scenario)


def test_a_full_run_records_each_state_in_order_with_its_fields(redis_url):
    async def scenario(store, client):
        await store.create("r1", prompt_tokens=8)
        await store.transition("r1", RequestState.PREFILLING, prefill_replica="p0", decode_replica="d1")
        await store.transition("r1", RequestState.TRANSFERRING)
        await store.transition("r1", RequestState.DECODING, transport="shm", kv_bytes=4096, kv_transfer_s=0.0125)
        await store.update("r1", completion_tokens=3)
        await store.transition("r1", RequestState.FINISHED, completion_tokens=7)
        record = await store.get("r1")
        assert record.state is RequestState.FINISHED
        assert [state for state, _ in record.history] == [
            RequestState.QUEUED, RequestState.PREFILLING, RequestState.TRANSFERRING,
            RequestState.DECODING, RequestState.FINISHED,
        ]
        times_unix_s = [unix_s for _, unix_s in record.history]
        assert times_unix_s == sorted(times_unix_s) and times_unix_s[-1] <= time.time()
        assert (record.prefill_replica, record.decode_replica, record.transport) == ("p0", "d1", "shm")
        assert (record.kv_bytes, record.kv_transfer_s, record.completion_tokens) == (4096, 0.0125, 7)

    run_with_store(redis_url, scenario)


@pytest.mark.parametrize("end", [RequestState.FINISHED, RequestState.ABORTED, RequestState.FAILED])
def test_ending_a_request_puts_a_ttl_on_all_its_keys(redis_url, end):
    async def scenario(store, client):
        await store.create("r1", prompt_tokens=8)
        await store.transition("r1", RequestState.PREFILLING)
        for key in ("req:r1", "req:r1:history"):
            assert 0 < await client.ttl(key) <= LIVE_TTL_S
        await store.transition("r1", end, error="boom" if end is RequestState.FAILED else "")
        for key in ("req:r1", "req:r1:history"):
            assert LIVE_TTL_S < await client.ttl(key) <= TTL_S
        assert (await store.get("r1")).state is end

    run_with_store(redis_url, scenario)


def test_an_ended_request_is_gone_after_its_ttl_and_its_id_free_again(redis_url):
    async def scenario(store, client):
        await store.create("r1", prompt_tokens=8)
        await store.transition("r1", RequestState.ABORTED)
        await asyncio.sleep(0.4)
        assert await store.get("r1") is None
        assert await client.exists("req:r1", "req:r1:history") == 0
        await store.create("r1", prompt_tokens=3)
        assert (await store.get("r1")).history[0][0] is RequestState.QUEUED

    run_with_store(redis_url, scenario, ttl_s=0.2)


def test_an_illegal_transition_is_refused_and_changes_nothing(redis_url):
    async def scenario(store, client):
        await store.create("r1", prompt_tokens=8)
        with pytest.raises(IllegalTransitionError, match="r1.*QUEUED -> DECODING"):
            await store.transition("r1", RequestState.DECODING, decode_replica="d0")
        await store.transition("r1", RequestState.ABORTED)
        with pytest.raises(IllegalTransitionError, match="ABORTED -> FINISHED"):
            await store.transition("r1", RequestState.FINISHED, completion_tokens=5)
        record = await store.get("r1")
        assert record.state is RequestState.ABORTED
        assert [state for state, _ in record.history] == [RequestState.QUEUED, RequestState.ABORTED]
        assert (record.decode_replica, record.completion_tokens) == ("", 0)

    run_with_store(redis_url, scenario)


def test_an_unknown_request_reads_as_none_and_cannot_be_changed(redis_url):
    async def scenario(store, client):
        assert await store.get("nope") is None
        with pytest.raises(RequestNotFoundError):
            await store.transition("nope", RequestState.PREFILLING)
        with pytest.raises(RequestNotFoundError):
            await store.update("nope", completion_tokens=1)
        assert await client.exists("req:nope", "req:nope:history") == 0

    run_with_store(redis_url, scenario)


def test_update_sets_only_known_fields_of_the_right_type(redis_url):
    async def scenario(store, client):
        await store.create("r1", prompt_tokens=8)
        await store.update("r1", completion_tokens=2, error="")
        for bad in ({"state": "FINISHED"}, {"created_unix_s": 1.0}, {"colour": "red"}, {"kv_bytes": "10"}):
            with pytest.raises(TypeError):
                await store.update("r1", **bad)
        with pytest.raises(TypeError):
            await store.transition("r1", RequestState.PREFILLING, prefill_replica=3)
        record = await store.get("r1")
        assert (record.state, record.completion_tokens, len(record.history)) == (RequestState.QUEUED, 2, 1)

    run_with_store(redis_url, scenario)


def test_of_racing_writers_from_one_state_exactly_one_wins(redis_url):
    num_writers = 16

    async def scenario(store, client):
        await store.create("r1", prompt_tokens=8)
        # Half start prefill, half fail it, each on its own connection: whichever commits first
        # decides which of the others may still move. PREFILLING may follow PREFILLING (a
        # request migrated while prefilling), so several prefill writers can win before a FAILED.
        targets = [RequestState.PREFILLING, RequestState.FAILED] * (num_writers // 2)
        clients = [connect_redis(redis_url, timeout_s=10.0) for _ in targets]
        try:
            results = await asyncio.gather(
                *(RequestStore(c).transition("r1", target) for c, target in zip(clients, targets)),
                return_exceptions=True,
            )
        finally:
            for c in clients:
                await c.aclose()
        assert all(isinstance(result, IllegalTransitionError) for result in results if result is not None)
        winners = sorted(target for target, result in zip(targets, results) if result is None)
        record = await store.get("r1")
        moves = [state for state, _ in record.history[1:]]
        # Exactly one FAILED won, last; only PREFILLING moves came before it.
        assert moves[-1] is RequestState.FAILED and set(moves[:-1]) <= {RequestState.PREFILLING}
        assert winners == sorted(moves) and record.state is RequestState.FAILED

    run_with_store(redis_url, scenario)
