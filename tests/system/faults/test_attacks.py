"""A cluster with a deployment secret against the attacks that worked on an open one.

Real processes (gateway, prefill, decode, Redis), real gRPC. Each test plays a stranger (no
secret), an insider without a reservation's write token, or whoever can write to Redis, and
checks that the attack is refused and that the requests of real clients are unharmed."""
from __future__ import annotations

import asyncio
import json
import socket

import grpc
import pytest
import redis
import torch
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from pdserve.cluster.health_probe import probe
from pdserve.cluster.internal_auth import InternalAuth
from pdserve.cluster.registry import ReplicaInfo
from pdserve.cluster.registry_signing import sign_entry, signature
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.shm import map_shared_pool
from pdserve.kvtransfer.wire import layout_from_proto
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc, kv_transfer_pb2, kv_transfer_pb2_grpc, prefill_pb2
from pdserve.v1 import prefill_pb2_grpc
from tests.system.faults.conftest import StreamRun, greedy_request

pytestmark = pytest.mark.faults

CONTEXT_LEN = 2048  # the tiny model's max_position_embeddings
NUM_BLOCKS = 256  # of the decode pool, 16 tokens each
CAP_BLOCKS = NUM_BLOCKS // 2  # --max-reserved-fraction-per-caller 0.5 (the default)
RPC_TIMEOUT_S = 20.0
SHM = common_pb2.TRANSPORT_SHM


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster([
        ("decode", "d0", ("--num-gpu-blocks", str(NUM_BLOCKS))),
        ("prefill", "p0", ()),
        ("gateway", "gw", ()),
    ])


def service(cluster, name):
    return next(s for s in cluster.services if s.name == name)


def prompt_of(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 1000 + 3 for i in range(length)]


async def stranger_calls(decode_endpoint: str, prefill_endpoint: str, channel_of,
                         write_streams: bool = True) -> dict[str, grpc.StatusCode]:
    """Every internal RPC once, on channels made by `channel_of(endpoint)`; each one's status.
    Without `write_streams` the request streams write nothing: a refusal reads none of them, and
    a client write that races the server's early status turns that status into INTERNAL on the
    client (grpc/grpc#36066), which would hide what the server said."""
    codes, details = {}, {}

    async def status_of(name, call):
        try:
            await call
            codes[name] = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as error:
            codes[name] = error.code()
            if error.code() != grpc.StatusCode.UNAUTHENTICATED:
                details[name] = error.details()

    async def read_all(stream):
        async for _ in stream:
            pass

    async def requests(*messages):
        if not write_streams:
            await asyncio.Event().wait()  # until the call ends
        for message in messages:
            yield message

    decode_channel, prefill_channel = channel_of(decode_endpoint), channel_of(prefill_endpoint)
    try:
        decode = decode_pb2_grpc.DecodeStub(decode_channel)
        prefill = prefill_pb2_grpc.PrefillStub(prefill_channel)
        kv = kv_transfer_pb2_grpc.KVTransferStub(decode_channel)
        timeout = RPC_TIMEOUT_S
        await status_of("Decode.Reserve", decode.Reserve(decode_pb2.ReserveRequest(
            request_id="stranger", num_prompt_tokens=16, transport=SHM), timeout=timeout))
        await status_of("Decode.Abort", decode.Abort(decode_pb2.DecodeAbortRequest(request_id="victim"), timeout=timeout))
        await status_of("Decode.Session", read_all(decode.Session(requests(decode_pb2.DecodeCommand(
            abort_request_id="victim")), timeout=timeout)))
        await status_of("Prefill.Run", read_all(prefill.Run(prefill_pb2.PrefillRequest(
            request_id="stranger", prompt_token_ids=[5, 6, 7]), timeout=timeout)))
        await status_of("Prefill.Abort", prefill.Abort(prefill_pb2.PrefillAbortRequest(request_id="victim"),
                                                       timeout=timeout))
        await status_of("KVTransfer.Push", kv.Push(requests(kv_transfer_pb2.KVChunk(request_id="victim", last=True)),
                                                   timeout=timeout))
        await status_of("KVTransfer.Commit", kv.Commit(kv_transfer_pb2.KVCommit(request_id="victim"), timeout=timeout))
        reflection = reflection_pb2_grpc.ServerReflectionStub(decode_channel)
        await status_of("reflection", read_all(reflection.ServerReflectionInfo(requests(
            reflection_pb2.ServerReflectionRequest(list_services="")), timeout=timeout)))
    finally:
        await decode_channel.close()
        await prefill_channel.close()
    print("refusals other than UNAUTHENTICATED:", details)  # shown when a test fails
    return codes


@pytest.mark.parametrize("credentials", ["none", "wrong secret"])
def test_every_internal_rpc_refuses_a_caller_without_the_secret(cluster, credentials):
    decode, prefill = service(cluster, "d0"), service(cluster, "p0")
    channel_of = grpc.aio.insecure_channel if credentials == "none" else InternalAuth(b"guessed", "x").channel
    codes = asyncio.run(stranger_calls(decode.endpoint, prefill.endpoint, channel_of, write_streams=False))
    assert codes == {name: grpc.StatusCode.UNAUTHENTICATED for name in (
        "Decode.Reserve", "Decode.Abort", "Decode.Session", "Prefill.Run", "Prefill.Abort", "KVTransfer.Push",
        "KVTransfer.Commit", "reflection")}
    assert probe(decode.endpoint, timeout_s=5.0).ready and probe(prefill.endpoint, timeout_s=5.0).ready  # health: open
    cluster.assert_all_kv_free()


def test_the_same_calls_with_the_secret_get_through(cluster):
    """The check above refuses for want of the secret, not for the calls' content."""
    decode, prefill = service(cluster, "d0"), service(cluster, "p0")
    codes = asyncio.run(stranger_calls(decode.endpoint, prefill.endpoint,
                                       lambda endpoint: cluster.internal_channel(cluster_service(cluster, endpoint))))
    assert codes["Decode.Reserve"] == grpc.StatusCode.OK
    assert codes["Decode.Abort"] == codes["Prefill.Abort"] == grpc.StatusCode.OK
    assert codes["KVTransfer.Push"] != grpc.StatusCode.UNAUTHENTICATED
    assert codes["reflection"] == grpc.StatusCode.OK
    asyncio.run(abort(cluster, "stranger"))
    cluster.assert_all_kv_free()


def cluster_service(cluster, endpoint):
    return next(s for s in cluster.services if s.endpoint == endpoint)


async def reserve(cluster, request_id: str, num_tokens: int, caller_id: str = "e2e-test"):
    async with cluster.internal_channel(service(cluster, "d0"), caller_id) as channel:
        return await decode_pb2_grpc.DecodeStub(channel).Reserve(decode_pb2.ReserveRequest(
            request_id=request_id, num_prompt_tokens=num_tokens, transport=SHM), timeout=RPC_TIMEOUT_S)


async def abort(cluster, *request_ids: str):
    async with cluster.internal_channel(service(cluster, "d0")) as channel:
        for request_id in request_ids:
            await decode_pb2_grpc.DecodeStub(channel).Abort(decode_pb2.DecodeAbortRequest(request_id=request_id),
                                                            timeout=RPC_TIMEOUT_S)


def test_a_reservation_beyond_the_context_length_is_refused_and_takes_nothing(cluster):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(reserve(cluster, "huge", 64 * CONTEXT_LEN))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "num_prompt_tokens" in refused.value.details() and str(CONTEXT_LEN) in refused.value.details()
    cluster.assert_all_kv_free()
    target = asyncio.run(reserve(cluster, "huge", CONTEXT_LEN))  # the id was never taken; the limit itself is fine
    assert len(target.block_ids) == CONTEXT_LEN // 16
    asyncio.run(abort(cluster, "huge"))
    cluster.assert_all_kv_free()


def test_one_caller_cannot_hold_more_than_its_share_of_the_pool_in_reservations(cluster):
    async def go():
        held = [await reserve(cluster, f"greedy-{i}", CONTEXT_LEN // 2, "gw-greedy") for i in range(2)]
        assert sum(len(target.block_ids) for target in held) == CAP_BLOCKS
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await reserve(cluster, "greedy-over", 16, "gw-greedy")
        other = await reserve(cluster, "polite", 16, "gw-other")  # another gateway still gets blocks
        await abort(cluster, "greedy-0", "greedy-1", "polite")
        return refused.value, other

    refused, other = asyncio.run(go())
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "cap" in refused.details()
    assert len(other.block_ids) == 1
    cluster.assert_all_kv_free()


def garbage_chunks(target: kv_transfer_pb2.KVTarget, spec: KVCacheSpec, token: bytes):
    """A push that is right in every way but its write token: all layers, all reserved blocks."""
    num_bytes = len(target.block_ids) * spec.bytes_per_layer_block // 2
    for layer in range(spec.num_layers):
        yield kv_transfer_pb2.KVChunk(
            request_id=target.request_id, layout=target.layout if layer == 0 else None, layer=layer,
            block_ids=target.block_ids, key=b"\x7f" * num_bytes, value=b"\x7f" * num_bytes,
            last=layer == spec.num_layers - 1, write_token=token)


@pytest.mark.parametrize("token", [b"", bytes(16)], ids=["missing", "wrong"])
def test_a_kv_write_without_the_reservations_token_is_refused_and_the_request_stays_correct(
        cluster, token, e2e_model, hf_greedy):
    prompt, max_tokens = prompt_of(11, 40), 12
    request_id = f"victim-{len(token)}"

    async def go():
        target = await reserve(cluster, request_id, len(prompt))
        assert len(target.write_token) >= 16
        spec = KVCacheSpec.from_layout(layout_from_proto(target.layout))
        pool = map_shared_pool(target.shm_name, spec, target.pool_num_blocks)
        blocks = list(target.block_ids)
        before = pool[:, :, blocks].clone()
        async with cluster.internal_channel(service(cluster, "d0"), "insider") as channel:
            kv = kv_transfer_pb2_grpc.KVTransferStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as pushed:
                await kv.Push(garbage_chunks(target, spec, token), timeout=RPC_TIMEOUT_S)
            with pytest.raises(grpc.aio.AioRpcError) as committed:
                await kv.Commit(kv_transfer_pb2.KVCommit(
                    request_id=request_id, layout=target.layout, num_bytes=len(blocks) * spec.bytes_per_block,
                    write_token=token), timeout=RPC_TIMEOUT_S)
        untouched = torch.equal(pool[:, :, blocks].view(torch.uint8), before.view(torch.uint8))
        for refused in (pushed.value, committed.value):
            assert refused.code() == grpc.StatusCode.PERMISSION_DENIED, refused.details()
            assert not any(str(block_id) in refused.details().replace(request_id, "") for block_id in blocks)
        # The real request, on the very reservation the attack aimed at.
        sampling = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        async with cluster.internal_channel(service(cluster, "p0")) as prefill_channel, \
                cluster.internal_channel(service(cluster, "d0")) as decode_channel:
            events = [event async for event in prefill_pb2_grpc.PrefillStub(prefill_channel).Run(
                prefill_pb2.PrefillRequest(request_id=request_id, prompt_token_ids=prompt, params=sampling, seed=0,
                                           target=target), timeout=60)]

            async def commands():
                yield decode_pb2.DecodeCommand(generate=decode_pb2.DecodeRequest(
                    request_id=request_id, prompt_token_ids=prompt, params=sampling, seed=0,
                    first_token_id=events[0].first_token.token_id))
                await asyncio.Event().wait()  # keeps the session open until it is cancelled

            session = decode_pb2_grpc.DecodeStub(decode_channel).Session(commands(), timeout=60)
            tokens = [events[0].first_token.token_id]
            async for message in session:
                for output in message.outputs:
                    assert not output.HasField("error"), output.error.message
                    tokens += output.token_ids
                if any(output.finish_reason for output in message.outputs):
                    break
            session.cancel()
        return untouched, tokens

    untouched, tokens = asyncio.run(go())
    assert untouched, "the refused write changed the victim's blocks"
    assert tokens == hf_greedy(e2e_model, [(prompt, max_tokens)])[0]
    cluster.assert_all_kv_free()


def test_a_forged_registry_entry_never_receives_a_call(cluster, e2e_model, hf_greedy):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    trap = f"127.0.0.1:{listener.getsockname()[1]}"
    real = {kind: next(iter(cluster.replicas(kind).values())) for kind in ("prefill", "decode")}
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True, socket_timeout=5)
    forged_ids = []
    try:
        for kind in ("prefill", "decode"):
            # Looks better than the real replica to the router: idle, all blocks free, first by id.
            fields = {**{k: v for k, v in real[kind].items() if k != "signature"}, "endpoint": trap,
                      "queued_tokens": 0, "free_blocks": 10 * NUM_BLOCKS, "total_blocks": 10 * NUM_BLOCKS,
                      "running_seqs": 0}
            for replica_id, value in ((f"0-unsigned-{kind}", json.dumps), (f"0-wrongly-signed-{kind}", None)):
                entry = {**fields, "replica_id": replica_id}
                ReplicaInfo(**entry)  # a well-formed entry, refused for its signature alone
                stored = value(entry) if value else sign_entry(entry, b"not the deployment secret")
                client.set(f"replica:{kind}:{replica_id}", stored, ex=120)
                client.zadd(f"replicas:{kind}", {replica_id: 4e9})
                forged_ids.append((kind, replica_id))
        cases = [(prompt_of(20 + i, 9 + 5 * i), 8) for i in range(4)]
        run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"after-forgery-{i}", prompt, max_tokens)
                                                   for i, (prompt, max_tokens) in enumerate(cases)])
        outcomes = asyncio.run(run.run())
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever connected to the forged endpoint
    finally:
        for kind, replica_id in forged_ids:
            client.delete(f"replica:{kind}:{replica_id}")
            client.zrem(f"replicas:{kind}", replica_id)
        client.close()
        listener.close()
    assert [outcome.error for outcome in outcomes] == [None] * len(cases)
    assert [outcome.token_ids for outcome in outcomes] == hf_greedy(e2e_model, cases)
    assert "ignoring the registry entry of prefill replica '0-unsigned-prefill'" in cluster.gateway.log_tail(200)
    cluster.assert_all_kv_free()


def test_registry_entries_of_a_deployment_with_a_secret_are_signed(cluster):
    for kind in ("prefill", "decode"):
        entry = next(iter(cluster.replicas(kind).values()))
        presented = entry.pop("signature")
        assert presented == signature(entry, cluster.internal_secret.encode())

