"""The replica registry as a specification: a beating replica is listed with its latest load and
its KV layout, and one that stops, is cancelled or is killed leaves the list within ttl_s."""
import asyncio
import gc
import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from pdserve.cluster.redis_client import connect_redis
from pdserve.cluster.registry import INDEX_GRACE_S, LiveReplicas, ReplicaHeartbeat
from pdserve.cluster.registry_entry import REGISTRY_PROTOCOL_VERSION
from pdserve.protocol.errors import InvalidConfigError
from tests.helpers import free_port

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]

TTL_S = 1.0
INTERVAL_S = 0.2
MARGIN_S = 0.5


def heartbeat(redis_url, replica_id, kind="decode", **overrides):
    settings = dict(endpoint=f"127.0.0.1:{5000 + len(replica_id)}", host_id="host-a", device="cpu",
                    ttl_s=TTL_S, interval_s=INTERVAL_S)
    return ReplicaHeartbeat(redis_url, kind, replica_id, **{**settings, **overrides})


def run_with_live(redis_url, scenario):
    async def main():
        client = connect_redis(redis_url, timeout_s=2.0)
        try:
            return await scenario(LiveReplicas(client))
        finally:
            await client.aclose()

    return asyncio.run(main())


async def wait_until(condition, timeout_s):
    """Polls the async `condition` until it holds; returns the seconds waited, or fails."""
    start_s = time.monotonic()
    while not await condition():
        assert time.monotonic() - start_s < timeout_s, f"condition not met within {timeout_s} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - start_s


def test_a_started_replica_is_listed_under_its_kind_only(redis_url):
    async def scenario(live):
        beat = heartbeat(redis_url, "d0", endpoint="127.0.0.1:7001", host_id="host-a", device="cuda:1")
        await beat.start()
        try:
            [replica] = await live.list("decode")
            assert (replica.replica_id, replica.kind, replica.endpoint, replica.host_id, replica.device) == (
                "d0", "decode", "127.0.0.1:7001", "host-a", "cuda:1"
            )
            assert replica.updated_unix_s <= time.time()
            assert await live.list("prefill") == []
        finally:
            await beat.stop()

    run_with_live(redis_url, scenario)


def test_an_entry_states_the_kv_layout_the_protocol_and_when_each_beat_wrote_it(redis_url):
    async def scenario(live):
        beat = heartbeat(redis_url, "d0", kv_layout_fingerprint="0123456789abcdef")
        await beat.start()
        try:
            [first] = await live.list("decode")

            async def rewritten():
                return (await live.list("decode"))[0].written_unix_s > first.written_unix_s

            await wait_until(rewritten, INTERVAL_S + MARGIN_S)
            return first
        finally:
            await beat.stop()

    started_unix_s = time.time()
    replica = run_with_live(redis_url, scenario)
    assert (replica.kv_layout_fingerprint, replica.protocol_version, replica.ttl_s) == (
        "0123456789abcdef", REGISTRY_PROTOCOL_VERSION, TTL_S)
    assert started_unix_s <= replica.written_unix_s <= time.time()


def test_reported_load_is_listed_within_one_interval(redis_url):
    async def scenario(live):
        beat = heartbeat(redis_url, "p0", kind="prefill")
        await beat.start()
        try:
            beat.update_load(queued_tokens=300, running_seqs=2, waiting_seqs=5)
            reported_unix_s = time.time()

            async def reported():
                return (await live.list("prefill"))[0].queued_tokens == 300

            await wait_until(reported, INTERVAL_S + MARGIN_S)
            [replica] = await live.list("prefill")
            assert (replica.running_seqs, replica.waiting_seqs, replica.free_blocks) == (2, 5, 0)
            assert replica.updated_unix_s <= reported_unix_s
            with pytest.raises(TypeError, match="free_blocs"):
                beat.update_load(free_blocs=3)
        finally:
            await beat.stop()

    run_with_live(redis_url, scenario)


def test_stop_removes_the_replica_at_once(redis_url):
    async def scenario(live):
        beat = heartbeat(redis_url, "d0")
        await beat.start()
        assert [r.replica_id for r in await live.list("decode")] == ["d0"]
        await beat.stop()
        assert await live.list("decode") == []

    run_with_live(redis_url, scenario)


# Like a crashed process, the cancelled replica never closes its Redis connection.
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_beating_replica_outlives_its_ttl_and_a_cancelled_one_leaves_within_it(redis_url):
    async def beat_then_get_cancelled():
        await heartbeat(redis_url, "d0").start()
        await asyncio.sleep(2 * TTL_S)  # outlives several TTLs only because the beat refreshes it
        # Returning without stop(): asyncio.run cancels the heartbeat task, as a crash would end it.

    async def scenario(live):
        assert [r.replica_id for r in await live.list("decode")] == ["d0"]

        async def gone():
            return await live.list("decode") == []

        await wait_until(gone, TTL_S + MARGIN_S)

    asyncio.run(beat_then_get_cancelled())
    gc.collect()  # the abandoned connection is reclaimed here, within this test
    run_with_live(redis_url, scenario)


REPLICA_PROCESS = """
import asyncio, sys
from pdserve.cluster.registry import ReplicaHeartbeat

async def main():
    ttl_s, interval_s = float(sys.argv[2]), float(sys.argv[3])
    beat = ReplicaHeartbeat(sys.argv[1], "decode", "killed", "127.0.0.1:9", "h", "cpu", ttl_s=ttl_s, interval_s=interval_s)
    await beat.start()
    print("beating", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.mark.timeout(30)
def test_a_killed_replica_process_leaves_the_list_within_ttl(redis_url):
    command = [sys.executable, "-c", REPLICA_PROCESS, redis_url, str(TTL_S), str(INTERVAL_S)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    with process:
        assert process.stdout.readline().strip() == "beating"

        async def scenario(live):
            assert [r.replica_id for r in await live.list("decode")] == ["killed"]
            os.kill(process.pid, signal.SIGKILL)

            async def gone():
                return await live.list("decode") == []

            await wait_until(gone, TTL_S + MARGIN_S)

        try:
            run_with_live(redis_url, scenario)
        finally:
            process.kill()


def test_listing_reads_the_index_whatever_else_redis_holds(redis_url):
    async def scenario():
        client = connect_redis(redis_url, timeout_s=2.0)
        beats = [heartbeat(redis_url, f"d{i:02d}") for i in range(25)] + [heartbeat(redis_url, "p0", kind="prefill")]
        try:
            for beat in beats:
                await beat.start()
            await client.mset({f"req:{i}": "x" for i in range(1000)} | {"replica:decode:d00:lease:r1": "x"})
            live = LiveReplicas(client)
            assert [r.replica_id for r in await live.list("decode")] == [f"d{i:02d}" for i in range(25)]
            assert [r.replica_id for r in await live.list("prefill")] == ["p0"]
        finally:
            for beat in beats:
                await beat.stop()
            await client.aclose()

    asyncio.run(scenario())


def test_a_heartbeat_drops_index_members_silent_past_the_grace(redis_url):
    async def scenario():
        client = connect_redis(redis_url, timeout_s=2.0)
        recent_s = time.time() - INDEX_GRACE_S / 2  # silent, but not for long: kept, though not listed
        await client.zadd("replicas:decode", {"gone": time.time() - 2 * INDEX_GRACE_S, "quiet": recent_s})
        beat = heartbeat(redis_url, "d0")
        try:
            await beat.start()
            assert await client.zrange("replicas:decode", 0, -1) == ["quiet", "d0"]
            assert [r.replica_id for r in await LiveReplicas(client).list("decode")] == ["d0"]
        finally:
            await beat.stop()
            assert await client.zrange("replicas:decode", 0, -1) == ["quiet"]
            await client.aclose()

    asyncio.run(scenario())


def test_start_fails_loudly_when_redis_cannot_be_reached():
    closed_port = free_port()  # nothing listens there
    beat = ReplicaHeartbeat(f"redis://127.0.0.1:{closed_port}/0", "decode", "d0", "e", "h", "cpu")
    with pytest.raises(redis.ConnectionError):
        asyncio.run(beat.start())


@pytest.mark.parametrize("kind, replica_id, ttl_s, interval_s", [
    ("encode", "r0", 3.0, 1.0),
    ("decode", "", 3.0, 1.0),
    ("decode", "r:0", 3.0, 1.0),
    ("decode", "r0", 1.0, 1.0),  # the key would expire between two beats
    ("decode", "r0", 1.0, 0.0),
])
def test_bad_heartbeat_settings_are_refused(kind, replica_id, ttl_s, interval_s):
    with pytest.raises(InvalidConfigError):
        ReplicaHeartbeat("redis://127.0.0.1:1/0", kind, replica_id, "e", "h", "cpu", ttl_s=ttl_s, interval_s=interval_s)

