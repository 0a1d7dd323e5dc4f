"""The live replica set in Redis: replicas announce themselves, the gateway reads who is alive.

    replica:{kind}:{replica_id}   JSON of a ReplicaInfo (cluster/registry_entry.py), signed with the
                                  deployment secret (cluster/registry_signing.py), with a TTL of
                                  ttl_s (ids hold no ':')
    replicas:{kind}               sorted set of replica ids, scored by their last heartbeat's
                                  expiry (unix s): the index LiveReplicas reads
    prefixes:{kind}:{replica_id}  the replica's cached prefixes (cluster.prefix_digest), with the
                                  TTL of its key, when it reports any

A replica's ReplicaHeartbeat rewrites its key every interval_s (< ttl_s) with a fresh TTL, so
the key lives while the replica keeps beating: `stop()` deletes it, and a killed
replica's key expires within ttl_s. Each write states the time it was written (`written_unix_s`),
the replica's KV layout fingerprint and the registry protocol version. The load in the key is the
last one the replica reported through `update_load`, so it lags the replica by up to interval_s;
`updated_unix_s` says when the replica reported it.

Liveness is the key alone; the index only says which keys to read, so listing costs two round
trips however many other keys (request records) Redis holds. An index member whose key has
expired is skipped, and every heartbeat drops members of its kind silent for over
INDEX_GRACE_S; a member dropped while alive (a replica whose clock runs that far behind) is back
at its next beat. With a signing key, `LiveReplicas` leaves out every entry whose signature does
not verify; it also leaves out the entries that registry_entry's reading rules refuse (under
another replica's key, of a newer protocol version, written too long ago: a replay), and logs
each such replica id once. Fields it does not know are ignored, so newer replicas stay listed.

While Redis cannot be reached, each replica logs one line per missed beat and keeps beating, so
it is listed again by the first beat after Redis returns (within interval_s). The gateway's
LiveReplicas keeps answering with the last set it read, for up to `stale_limit_s`: the requests
already streaming can still move off a replica that fails meanwhile (one that died is refused
and excluded as any failed replica is). Past that bound, or with no set read yet, listing raises
StateStoreUnavailableError (UNAVAILABLE) rather than route on a picture that old.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from pathlib import Path

import redis.asyncio as redis
from redis.exceptions import RedisError

from pdserve.cluster.prefix_digest import digest_key, encode_digest
from pdserve.cluster.redis_client import StateStoreUnavailableError, connect_redis, state_store_errors
from pdserve.cluster.registry_entry import (LOAD_FIELDS, MAX_CLOCK_SKEW_S, REGISTRY_PROTOCOL_VERSION, ReplicaInfo,
                                            ReplicaKind, UnusableEntryError, read_entry)
from pdserve.cluster.registry_signing import sign_entry, verified_fields
from pdserve.protocol.errors import InvalidConfigError

logger = logging.getLogger(__name__)

_KINDS = ("prefill", "decode")
_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_SHM_PATH = Path("/dev/shm")
INDEX_GRACE_S = 60.0


def default_host_id(boot_id_path: Path = _BOOT_ID_PATH, shm_path: Path = _SHM_PATH) -> str:
    """Equal for two processes exactly when they can share KV memory: the same kernel and the same
    POSIX shared memory. The kernel is its boot id: every process on one machine sees it,
    containers and network namespaces included (they share the kernel but not the hostname), and
    another machine or a reboot changes it. POSIX shared memory (the shm transport's segments, and
    the reference counters of torch's CUDA IPC) lives in the file system mounted at /dev/shm, and
    one kernel can hold many of those: each Kubernetes pod, and each container without `ipc: host`,
    gets a private one, where a segment another names does not exist. So the id also carries the
    device number of the /dev/shm the process sees, which two mounts share only when they are one
    file system. Falls back to the hostname where the boot id cannot be read, and to the kernel
    alone where there is no /dev/shm (shared memory is then the kernel's own, as on macOS)."""
    kernel = "boot-" + boot_id_path.read_text().strip() if boot_id_path.exists() else socket.gethostname()
    try:
        return f"{kernel}-shm-{os.stat(shm_path).st_dev}"
    except FileNotFoundError:
        return kernel


class ReplicaHeartbeat:
    """The replica's side: keeps `replica:{kind}:{replica_id}` alive while the replica runs."""

    def __init__(
        self,
        redis_url: str,
        kind: ReplicaKind,
        replica_id: str,
        endpoint: str,
        host_id: str,
        device: str,
        ttl_s: float = 3.0,
        interval_s: float = 1.0,
        signing_key: bytes | None = None,  # the deployment secret; None: entries go unsigned
        kv_layout_fingerprint: str = "",  # kvtransfer.layout.KVLayout.fingerprint; "": not stated
    ):
        if kind not in _KINDS:
            raise InvalidConfigError(f"replica kind must be one of {_KINDS}, got {kind!r}")
        if not replica_id or ":" in replica_id:
            raise InvalidConfigError(f"replica id must be non-empty and free of ':', got {replica_id!r}")
        if not 0 < interval_s < ttl_s:
            raise InvalidConfigError(f"need 0 < interval_s < ttl_s, got {interval_s} and {ttl_s}")
        self._redis_url = redis_url
        self._key = _replica_key(kind, replica_id)
        self._index = _index_key(kind)
        self._ttl_s = ttl_s
        self._ttl_ms = round(ttl_s * 1000)
        self._interval_s = interval_s
        self._info = ReplicaInfo(replica_id, kind, endpoint, host_id, device,
                                 kv_layout_fingerprint=kv_layout_fingerprint,
                                 protocol_version=REGISTRY_PROTOCOL_VERSION, ttl_s=ttl_s)
        self._digest_key = digest_key(kind, replica_id)
        self._digest: str | None = None  # None: never reported
        self._signing_key = signing_key
        self._client: redis.Redis | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Writes the key once (raising if Redis cannot be reached) and starts beating."""
        # A write may take up to the socket timeout; keeping it under interval_s keeps the beat.
        self._client = connect_redis(self._redis_url, timeout_s=self._interval_s)
        self._info = dataclasses.replace(self._info, updated_unix_s=time.time())
        try:
            await self._write()
        except BaseException:
            await self._client.aclose()
            self._client = None
            raise
        self._task = asyncio.create_task(self._beat(), name=f"heartbeat {self._key}")

    def update_load(self, **load: int | float) -> None:
        """Records the replica's load; the next beat publishes it. Unknown fields raise TypeError."""
        unknown = load.keys() - LOAD_FIELDS
        if unknown:
            raise TypeError(f"not load fields: {sorted(unknown)}")
        self._info = dataclasses.replace(self._info, **load, updated_unix_s=time.time())

    def update_prefixes(self, block_hashes: list[bytes]) -> None:
        """Records the replica's cached prefix blocks, newest first; the next beat publishes them."""
        self._digest = encode_digest(block_hashes)

    async def stop(self) -> None:
        """Stops beating and deletes the key, so the gateway stops routing here at once."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._client is not None:
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.delete(self._key, self._digest_key)
                    pipe.zrem(self._index, self._info.replica_id)
                    await pipe.execute()
            finally:
                await self._client.aclose()
                self._client = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self._write()
            except RedisError as error:
                # Keep beating: once Redis answers again the replica reappears.
                logger.warning("heartbeat %s not written: %s", self._key, error)

    async def _write(self) -> None:
        now_unix_s = time.time()
        entry = dataclasses.asdict(dataclasses.replace(self._info, written_unix_s=now_unix_s))
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.set(self._key, sign_entry(entry, self._signing_key), px=self._ttl_ms)
            if self._digest is not None:
                pipe.set(self._digest_key, self._digest, px=self._ttl_ms)
            pipe.zadd(self._index, {self._info.replica_id: now_unix_s + self._ttl_s})
            pipe.zremrangebyscore(self._index, "-inf", now_unix_s - INDEX_GRACE_S)
            await pipe.execute()


class LiveReplicas:
    """The gateway's side: reads the replicas whose heartbeat keys have not expired."""

    def __init__(self, client: redis.Redis, signing_key: bytes | None = None, *, stale_limit_s: float = 30.0,
                 max_clock_skew_s: float = MAX_CLOCK_SKEW_S):
        """`client` must decode replies (cluster.redis_client.connect_redis makes one);
        `signing_key`: the deployment secret, which every entry taken must be signed with;
        `max_clock_skew_s`: how far a replica's clock may run from this one's (registry_entry)."""
        if stale_limit_s < 0:
            raise InvalidConfigError(f"stale_limit_s must be >= 0, got {stale_limit_s}")
        self._redis = client
        self._signing_key = signing_key
        self._max_clock_skew_s = max_clock_skew_s
        self._rejected_ids: set[str] = set()  # logged once each
        self._stale_limit_s = stale_limit_s
        self._last_read: dict[str, tuple[float, list[ReplicaInfo]]] = {}  # kind: (monotonic s, replicas)

    async def list(self, kind: ReplicaKind) -> list[ReplicaInfo]:
        """The live replicas of `kind`, ordered by replica_id; the last set read while Redis is
        unreachable, up to stale_limit_s after it was read."""
        try:
            replicas = await self._read(kind)
        except StateStoreUnavailableError:
            read_s, replicas = self._last_read.get(kind, (None, None))
            if read_s is None or time.monotonic() - read_s > self._stale_limit_s:
                raise
            return replicas
        self._last_read[kind] = time.monotonic(), replicas
        return replicas

    async def _read(self, kind: ReplicaKind) -> list[ReplicaInfo]:
        with state_store_errors():
            replica_ids = await self._redis.zrange(_index_key(kind), 0, -1)
            if not replica_ids:
                return []
            # An indexed replica whose key has expired reads as None and is left out.
            values = await self._redis.mget([_replica_key(kind, replica_id) for replica_id in replica_ids])
        now_unix_s = time.time()
        replicas = [replica for replica_id, value in zip(replica_ids, values, strict=True)
                    if value is not None and (replica := self._used(kind, replica_id, value, now_unix_s)) is not None]
        return sorted(replicas, key=lambda replica: replica.replica_id)

    def _used(self, kind: str, replica_id: str, value: str, now_unix_s: float) -> ReplicaInfo | None:
        """The replica the entry announces, or None (logged once per replica id) for an entry that
        does not verify or that the reading rules (cluster/registry_entry.py) leave out."""
        fields = verified_fields(value, self._signing_key)
        try:
            if fields is None:
                raise UnusableEntryError("not JSON, or not signed with the deployment secret")
            return read_entry(fields, kind, replica_id, now_unix_s, self._max_clock_skew_s)
        except UnusableEntryError as error:
            if replica_id not in self._rejected_ids:
                self._rejected_ids.add(replica_id)
                logger.warning("ignoring the registry entry of %s replica %r: %s", kind, replica_id, error)
            return None


def _replica_key(kind: str, replica_id: str) -> str:
    return f"replica:{kind}:{replica_id}"


def _index_key(kind: str) -> str:
    return f"replicas:{kind}"
