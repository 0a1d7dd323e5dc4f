"""Signed registry entries: with the deployment secret, the gateway's view of the registry holds
only replicas whose entry is signed with it; a forged, unsigned, moved or replayed entry is left
out, and an entry with fields the gateway does not know is kept."""
import asyncio
import dataclasses
import json
import time

import pytest

from pdserve.cluster.redis_client import connect_redis
from pdserve.cluster.registry import LiveReplicas, ReplicaHeartbeat, ReplicaInfo
from pdserve.cluster.registry_entry import REGISTRY_PROTOCOL_VERSION
from pdserve.cluster.registry_signing import sign_entry

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("empty_redis")]

SECRET = b"deployment-secret"


async def forge(client, kind, replica_id, value):
    await client.set(f"replica:{kind}:{replica_id}", value, px=10_000)
    await client.zadd(f"replicas:{kind}", {replica_id: 4e9})


def test_only_entries_signed_with_the_secret_are_listed(redis_url, caplog):
    async def main():
        client = connect_redis(redis_url, timeout_s=2.0)
        beat = ReplicaHeartbeat(redis_url, "prefill", "real", "127.0.0.1:1", "host", "cpu",
                                ttl_s=5.0, interval_s=1.0, signing_key=SECRET)
        await beat.start()
        try:
            fake = dataclasses.asdict(ReplicaInfo("fake", "prefill", "127.0.0.1:2", "host", "cpu"))
            await forge(client, "prefill", "unsigned", json.dumps({**fake, "replica_id": "unsigned"}))
            await forge(client, "prefill", "wrongkey", sign_entry({**fake, "replica_id": "wrongkey"}, b"guess"))
            await forge(client, "prefill", "garbage", "{not json")
            # A genuine entry copied under another id is not that replica.
            genuine = await client.get("replica:prefill:real")
            await forge(client, "prefill", "copied", genuine)
            unsigned_view = await LiveReplicas(client).list("prefill")
            caplog.clear()
            live = LiveReplicas(client, SECRET)
            signed = await live.list("prefill")
            assert await live.list("prefill") == signed
            return signed, unsigned_view
        finally:
            await beat.stop()
            await client.aclose()

    signed, unsigned_view = asyncio.run(main())
    assert [replica.replica_id for replica in signed] == ["real"]
    assert signed[0].endpoint == "127.0.0.1:1"
    # An open deployment (no secret) takes entries as they are: what signing protects against.
    assert "unsigned" in [replica.replica_id for replica in unsigned_view]
    warnings = [record.getMessage() for record in caplog.records if "ignoring the registry entry" in record.getMessage()]
    for replica_id in ("unsigned", "wrongkey", "garbage", "copied"):  # once each, however often it lists
        assert sum(f"'{replica_id}'" in message for message in warnings) == 1, warnings


def test_a_signed_entry_is_listed_while_fresh_and_readable_whatever_fields_it_adds(redis_url, caplog):
    """What a newer replica writes is listed; a genuine entry recorded an hour ago and written
    back (a replay), or one of a protocol this gateway predates, is not."""
    async def main():
        client = connect_redis(redis_url, timeout_s=2.0)
        now_unix_s = time.time()
        entry = dataclasses.asdict(ReplicaInfo("", "decode", "127.0.0.1:2", "host", "cpu", free_blocks=8,
                                               protocol_version=REGISTRY_PROTOCOL_VERSION,
                                               written_unix_s=now_unix_s, ttl_s=3.0))
        cases = {"newer": {"kv_pool_tier": "host-dram"},
                 "replayed": {"written_unix_s": now_unix_s - 3600},
                 "next-protocol": {"protocol_version": REGISTRY_PROTOCOL_VERSION + 1}}
        try:
            for replica_id, changes in cases.items():
                await forge(client, "decode", replica_id, sign_entry({**entry, **changes, "replica_id": replica_id},
                                                                     SECRET))
            caplog.clear()
            return await LiveReplicas(client, SECRET).list("decode")
        finally:
            await client.aclose()

    listed = asyncio.run(main())
    assert [(replica.replica_id, replica.free_blocks) for replica in listed] == [("newer", 8)]
    warnings = "\n".join(record.getMessage() for record in caplog.records)
    assert "'replayed': written 3600" in warnings and "'next-protocol': protocol version" in warnings
