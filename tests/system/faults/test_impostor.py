"""An impostor on a dead replica's port, in a deployment on mutual TLS: no call reaches it.

A decode and a prefill replica are killed with SIGKILL; before their registry entries expire,
plain gRPC servers take over their ports: one with a self-signed certificate (not from the
deployment's CA), one with no TLS at all. A burst of requests then goes to the gateway, which
still sees both entries. The callers do dial the impostors (each counts the connections made to
its port), but every connection ends in the TLS handshake: neither impostor receives a single
call, so neither ever holds the deployment secret or a prompt, and every request moves to the
live replicas and gives transformers' greedy tokens.
"""
from __future__ import annotations

import asyncio

import grpc
import pytest

from pdserve.cluster.internal_auth import SECRET_KEY
from tests.system.faults.conftest import StreamRun, assert_prefill_kv_free, greedy_request, wait_until_gone
from tests.system.faults.front_clients import self_signed_certificate

pytestmark = pytest.mark.faults

CASES = [([(seed * 7919 + i * 104729) % 1000 + 3 for i in range(6 + 9 * seed)], 8) for seed in range(8)]
RELAY_CHUNK_BYTES = 65536
STOP_TIMEOUT_S = 5.0


class Impostor:
    """A plain grpc.aio server (TLS with `credentials`, else plaintext) that notes the metadata of
    every call reaching it, behind a TCP relay on the port it took over that counts the
    connections callers open there."""

    def __init__(self, credentials: grpc.ServerCredentials | None):
        self.calls: list[dict] = []  # each call's metadata, before any handler
        self.num_connections = 0
        self._credentials = credentials
        self._relays: set[asyncio.Task] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self, port: int) -> Impostor:
        self._server = grpc.aio.server(interceptors=[_Recorder(self.calls)])
        bind = "127.0.0.1:0"
        self._inner_port = (self._server.add_secure_port(bind, self._credentials) if self._credentials
                            else self._server.add_insecure_port(bind))
        await self._server.start()
        self._relay = await asyncio.start_server(self._relay_one, "127.0.0.1", port)
        return self

    async def stop(self) -> None:
        """Closes the port, ends the relayed connections (their pipes read EOF), stops the server."""
        self._relay.close()
        for writer in self._writers:
            writer.close()
        if self._relays:
            await asyncio.wait(self._relays, timeout=STOP_TIMEOUT_S)
        await self._server.stop(0)

    async def _relay_one(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        self._relays.add(asyncio.current_task())
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self._inner_port)
        self._writers += [client_writer, server_writer]
        await asyncio.gather(_pipe(client_reader, server_writer), _pipe(server_reader, client_writer))


class _Recorder(grpc.aio.ServerInterceptor):
    def __init__(self, calls: list[dict]):
        self._calls = calls

    async def intercept_service(self, continuation, details):
        self._calls.append(dict(details.invocation_metadata or ()))
        return await continuation(details)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(RELAY_CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster([
        ("decode", "d0", ()), ("decode", "d1", ()), ("prefill", "p0", ()), ("prefill", "p1", ()),
        ("gateway", "gw", ("--prefill-placement", "remote")),
    ], internal_tls=True)


def service(cluster, name):
    return next(s for s in cluster.services if s.name == name)


def test_impostors_on_dead_replicas_ports_receive_no_call_and_every_request_succeeds(
        cluster, e2e_model, hf_greedy, tmp_path):
    expected = hf_greedy(e2e_model, CASES)
    self_signed = self_signed_certificate(tmp_path)
    victims = {"d1": grpc.ssl_server_credentials([(self_signed.key_path.read_bytes(), self_signed.pem)]),
               "p1": None}

    async def go():
        for name in victims:
            cluster.kill(service(cluster, name))
        impostors = {name: await Impostor(credentials).start(service(cluster, name).port)
                     for name, credentials in victims.items()}
        listed = set(cluster.replicas("decode")) | set(cluster.replicas("prefill"))
        try:
            outcomes = await StreamRun(cluster.gateway.endpoint, [
                greedy_request(f"impostor-{i}", prompt, max_tokens) for i, (prompt, max_tokens) in enumerate(CASES)
            ]).run()
        finally:
            for impostor in impostors.values():
                await impostor.stop()
        return listed, impostors, outcomes

    listed, impostors, outcomes = asyncio.run(go())
    assert set(victims) <= listed, "the victims left the registry before the requests: nothing was shown"
    for name, impostor in impostors.items():
        assert impostor.num_connections >= 1, f"no caller dialled {name}'s port"
        assert impostor.calls == [], f"calls reached the impostor on {name}'s port"
        assert not any(SECRET_KEY in metadata for metadata in impostor.calls)
    assert [outcome.error for outcome in outcomes] == [None] * len(CASES)
    assert [outcome.token_ids for outcome in outcomes] == expected
    for kind, name in (("decode", "d1"), ("prefill", "p1")):
        wait_until_gone(cluster, kind, name)
    cluster.assert_all_kv_free()
    assert_prefill_kv_free(cluster)
