"""KV transfer end to end: a decode replica's pool and KVReceiver live in their own process (a
real gRPC server over a shared-memory pool), this process plays the prefill replica.

The specification: a prompt's blocks land byte for byte in the blocks reserved for it and
nowhere else; a layout mismatch, a write outside the reservation, a write without the
reservation's write token, an unknown request, an expired reservation and a broken stream are
all refused, and none of them lands; no refusal names block ids."""
import asyncio
import os

import grpc
import pytest
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.protocol.errors import LayoutMismatchError, TransferError, TransportUnavailableError
from pdserve.kvtransfer.grpc_stream import GrpcSender
from pdserve.kvtransfer.layout import make_layout
from pdserve.kvtransfer.shm import SHM_DIR, map_shared_pool
from pdserve.kvtransfer.testing.loopback import LoopbackConfig, LoopbackDecode
from pdserve.kvtransfer.transports import create_sender
from pdserve.kvtransfer.wire import layout_to_proto
from pdserve.v1 import common_pb2, kv_transfer_pb2, kv_transfer_pb2_grpc

MODEL = "tiny-llama"
NUM_DECODE_BLOCKS = 32
NUM_PREFILL_BLOCKS = 12
SHM, GRPC = common_pb2.TRANSPORT_SHM, common_pb2.TRANSPORT_GRPC


def spec_of(dtype: torch.dtype, block_size: int = 4) -> KVCacheSpec:
    return KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=8, block_size=block_size, dtype=dtype)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16, torch.int8], ids=["fp32", "bf16", "int8"])
def decode(request):
    config = LoopbackConfig(spec_of(request.param), NUM_DECODE_BLOCKS, "cpu", MODEL, call_timeout_s=20.0)
    with LoopbackDecode(config) as loopback:
        yield loopback


def prefill_pool(decode: LoopbackDecode, seed: int) -> torch.Tensor:
    spec = decode.config.spec
    generator = torch.Generator().manual_seed(seed)
    if spec.dtype == torch.int8:  # entries' levels and scales' bytes alike: any byte
        return torch.randint(-128, 128, spec.shape(NUM_PREFILL_BLOCKS), generator=generator, dtype=torch.int8)
    return torch.randn(spec.shape(NUM_PREFILL_BLOCKS), generator=generator).to(spec.dtype)


def fresh_id(decode: LoopbackDecode, name: str) -> str:
    return f"{name}-{decode.config.spec.dtype}-{os.urandom(4).hex()}"


def assert_only_blocks_changed(before: torch.Tensor, after: torch.Tensor, block_ids: list[int]) -> None:
    others = [b for b in range(before.shape[2]) if b not in block_ids]
    assert torch.equal(after[:, :, others].view(torch.uint8), before[:, :, others].view(torch.uint8))


def test_blocks_land_exactly_in_the_reserved_blocks_over_shm_and_grpc_at_once(decode):
    kv = prefill_pool(decode, seed=1)
    shm_src, shm_dst = [3, 0, 7, 5, 11], [30, 2, 17, 9, 4]
    grpc_src, grpc_dst = [1, 2, 8, 10, 6, 9], [12, 25, 0, 6, 21, 14]
    shm_id, grpc_id = fresh_id(decode, "shm"), fresh_id(decode, "grpc")
    shm_target = decode.reserve(shm_id, shm_dst, SHM)
    grpc_target = decode.reserve(grpc_id, grpc_dst, GRPC)
    before = decode.pool()
    block_bytes = decode.config.spec.bytes_per_block

    async def send_both():
        shm_sender = create_sender(SHM, decode.layout)
        # Two blocks per chunk: every layer travels in several chunks.
        grpc_sender = GrpcSender(decode.layout, rpc_timeout_s=20.0, max_chunk_bytes=block_bytes // 3 * 2)
        try:
            return await asyncio.gather(
                shm_sender.send(shm_id, kv, shm_src, shm_target),
                grpc_sender.send(grpc_id, kv, grpc_src, grpc_target),
            )
        finally:
            await shm_sender.close()
            await grpc_sender.close()

    shm_result, grpc_result = asyncio.run(send_both())

    after = decode.pool()
    assert torch.equal(after[:, :, shm_dst], kv[:, :, shm_src])
    assert torch.equal(after[:, :, grpc_dst], kv[:, :, grpc_src])
    assert_only_blocks_changed(before, after, shm_dst + grpc_dst)
    assert (shm_result.transport, grpc_result.transport) == (SHM, GRPC)
    assert (shm_result.num_bytes, grpc_result.num_bytes) == (5 * block_bytes, 6 * block_bytes)
    landed = decode.landed()
    assert (landed[shm_id], landed[grpc_id]) == (5 * block_bytes, 6 * block_bytes)


@pytest.mark.parametrize("transport", [SHM, GRPC], ids=["shm", "grpc"])
def test_layout_mismatch_is_refused_before_the_first_byte(decode, transport):
    request_id = fresh_id(decode, "mismatch")
    target = decode.reserve(request_id, [1, 2], transport)
    prefill_layout = make_layout(MODEL, spec_of(decode.config.spec.dtype, block_size=8))
    kv = torch.zeros(3, 2, 4, 8, 2, 8, dtype=decode.config.spec.dtype)
    before = decode.pool()

    async def send():
        sender = create_sender(transport, prefill_layout)
        try:
            await sender.send(request_id, kv, [0, 1], target)
        finally:
            await sender.close()

    with pytest.raises(LayoutMismatchError, match=r"block_size 8 \(prefill\) != 4 \(decode\)"):
        asyncio.run(send())
    assert torch.equal(decode.pool().view(torch.uint8), before.view(torch.uint8))
    assert request_id not in decode.landed()


def chunk(decode, request_id, layer, block_ids, fill, layout=None, last=False, token=b""):
    spec = decode.config.spec
    blocks = torch.full((len(block_ids), *spec.block_shape), fill, dtype=spec.dtype)
    data = blocks.view(torch.uint8).numpy().tobytes()
    return kv_transfer_pb2.KVChunk(
        request_id=request_id, layout=layout and layout_to_proto(layout), layer=layer, block_ids=block_ids, key=data,
        value=data, last=last, write_token=token,
    )


async def push(endpoint, chunks):
    """Raw KVTransfer.Push; returns the status code the decode replica answered with."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = kv_transfer_pb2_grpc.KVTransferStub(channel)
        try:
            await stub.Push(chunks, timeout=20.0)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details()
        return grpc.StatusCode.OK, ""


async def commit(endpoint, request_id, layout, num_bytes, token=b""):
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = kv_transfer_pb2_grpc.KVTransferStub(channel)
        try:
            request = kv_transfer_pb2.KVCommit(request_id=request_id, layout=layout_to_proto(layout),
                                               num_bytes=num_bytes, write_token=token)
            await stub.Commit(request, timeout=20.0)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details()
        return grpc.StatusCode.OK, ""


async def stream(*chunks):
    for item in chunks:
        yield item


def test_receiver_refuses_a_mismatched_layout_with_the_clear_message(decode):
    request_id = fresh_id(decode, "mismatch-raw")
    token = decode.reserve(request_id, [1], GRPC).write_token
    wrong = make_layout(MODEL, spec_of(decode.config.spec.dtype, block_size=8))
    code, details = asyncio.run(push(decode.endpoint, stream(chunk(decode, request_id, 0, [1], 1.0, wrong, last=True,
                                                                   token=token))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "KV layout mismatch: block_size 4 (decode) != 8 (prefill)" in details
    code, details = asyncio.run(commit(decode.endpoint, request_id, wrong, decode.config.spec.bytes_per_block, token))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "block_size 4 (decode) != 8 (prefill)" in details
    assert request_id not in decode.landed()


def test_writing_outside_the_reservation_is_refused_and_writes_nothing(decode):
    victim_id, request_id = fresh_id(decode, "victim"), fresh_id(decode, "intruder")
    decode.reserve(victim_id, [20, 21], GRPC)
    token = decode.reserve(request_id, [22], GRPC).write_token
    before = decode.pool()
    code, details = asyncio.run(
        push(decode.endpoint, stream(chunk(decode, request_id, 0, [22, 21], 7.0, decode.layout, last=True, token=token)))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not reserved for it" in details
    leaked = details.replace(request_id, "")  # the id is random hex: it may hold "21" itself
    assert "21" not in leaked and "22" not in leaked  # block ids are not the caller's to learn
    assert torch.equal(decode.pool().view(torch.uint8), before.view(torch.uint8))
    assert request_id not in decode.landed()


@pytest.mark.parametrize("token", [b"", b"\x00" * 16], ids=["missing", "wrong"])
def test_a_write_without_the_reservations_token_is_refused_and_writes_nothing(decode, token):
    request_id = fresh_id(decode, "tokenless")
    target = decode.reserve(request_id, [23, 24], GRPC)
    assert len(target.write_token) >= 16 and target.write_token != token
    before = decode.pool()
    chunks = [chunk(decode, request_id, layer, [23, 24], 9.0, decode.layout if layer == 0 else None,
                    last=layer == 2, token=token) for layer in range(3)]
    code, details = asyncio.run(push(decode.endpoint, stream(*chunks)))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "write token" in details
    code, details = asyncio.run(commit(decode.endpoint, request_id, decode.layout,
                                       2 * decode.config.spec.bytes_per_block, token))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "write token" in details
    assert torch.equal(decode.pool().view(torch.uint8), before.view(torch.uint8))
    assert request_id not in decode.landed()
    # The token's holder still gets its KV in.
    kv = prefill_pool(decode, seed=3)

    async def send():
        sender = GrpcSender(decode.layout, rpc_timeout_s=20.0)
        try:
            await sender.send(request_id, kv, [0, 1], target)
        finally:
            await sender.close()

    asyncio.run(send())
    assert torch.equal(decode.pool()[:, :, [23, 24]], kv[:, :, [0, 1]])


def test_a_push_refused_while_its_sender_still_streams_reports_the_refusal(decode):
    """Not INTERNAL: with many chunks still on their way when the decode end refuses the first,
    an asyncio client would see its failed writes in place of the refusal (about one push in ten
    here) if the decode end answered before reading the stream to its end."""
    for _ in range(20):
        request_id = fresh_id(decode, "refused-mid-stream")
        decode.reserve(request_id, [30], GRPC)
        first = chunk(decode, request_id, 0, [30], 1.0, decode.layout, token=b"")
        rest = kv_transfer_pb2.KVChunk(request_id=request_id, layer=1, block_ids=[30], key=bytes(2**16),
                                       value=bytes(2**16))
        code, details = asyncio.run(push(decode.endpoint, stream(first, *[rest] * 64)))
        decode.release(request_id)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "write token" in details, (code, details)


def test_an_unknown_request_is_refused(decode):
    code, details = asyncio.run(
        push(decode.endpoint, stream(chunk(decode, "nobody", 0, [1], 1.0, decode.layout, last=True)))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "nobody" in details
    code, _ = asyncio.run(commit(decode.endpoint, "nobody", decode.layout, 0))
    assert code == grpc.StatusCode.NOT_FOUND

    request_id = fresh_id(decode, "released")
    target = decode.reserve(request_id, [3], SHM)
    assert decode.release(request_id) is True  # no writer held its write fence
    before = decode.pool()

    async def send():
        sender = create_sender(SHM, decode.layout)
        try:
            await sender.send(request_id, prefill_pool(decode, seed=2), [0], target)
        finally:
            await sender.close()

    with pytest.raises(TransferError, match="reservation ended before the copy"):
        asyncio.run(send())
    assert torch.equal(decode.pool().view(torch.uint8), before.view(torch.uint8))  # not a byte written
    assert request_id not in decode.landed()


def test_wrong_sizes_and_incomplete_pushes_are_refused(decode):
    request_id = fresh_id(decode, "sizes")
    token = decode.reserve(request_id, [26, 27], GRPC).write_token
    short = chunk(decode, request_id, 0, [26, 27], 1.0, decode.layout, last=True, token=token)
    short.key = short.key[:-1]
    code, _ = asyncio.run(push(decode.endpoint, stream(short)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # `last` after only layer 0 of a 3-layer model: not the whole KV.
    code, details = asyncio.run(
        push(decode.endpoint, stream(chunk(decode, request_id, 0, [26, 27], 1.0, decode.layout, last=True, token=token)))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "layer 1 missing 2 of its 2 blocks" in details
    code, details = asyncio.run(push(decode.endpoint, stream(chunk(decode, request_id, 0, [26, 27], 1.0, decode.layout,
                                                                   token=token))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "ended before its last chunk" in details
    code, _ = asyncio.run(commit(decode.endpoint, request_id, decode.layout, 1, token))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert request_id not in decode.landed()


async def push_raw(endpoint, messages):
    """KVTransfer.Push of arbitrary bytes, as a client with a broken encoder would send them."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        call = channel.stream_unary("/pdserve.v1.KVTransfer/Push", request_serializer=lambda raw: raw)
        try:
            await call(stream(*messages), timeout=20.0)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details()
        return grpc.StatusCode.OK, ""


def test_a_malformed_chunk_is_an_invalid_argument_not_an_internal_error(decode):
    request_id = fresh_id(decode, "malformed")
    token = decode.reserve(request_id, [28], GRPC).write_token
    encoded = chunk(decode, request_id, 0, [28], 1.0, decode.layout, token=token).SerializeToString()
    code, details = asyncio.run(push_raw(decode.endpoint, [encoded[:-1]]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "malformed KV chunk" in details
    code, _ = asyncio.run(push_raw(decode.endpoint, [b"\xff\xff\xff"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert request_id not in decode.landed()


def test_a_push_cancelled_mid_stream_leaves_the_reservation_unlanded(decode):
    request_id = fresh_id(decode, "cancelled")
    token = decode.reserve(request_id, [28], GRPC).write_token

    async def cancel_after_first_chunk():
        async with grpc.aio.insecure_channel(decode.endpoint) as channel:
            stub = kv_transfer_pb2_grpc.KVTransferStub(channel)
            never = asyncio.Event()

            async def chunks():
                yield chunk(decode, request_id, 0, [28], 3.0, decode.layout, token=token)
                await never.wait()

            call = stub.Push(chunks(), timeout=20.0)
            await asyncio.sleep(0.5)  # the first chunk reaches the receiver
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

    asyncio.run(cancel_after_first_chunk())
    assert request_id not in decode.landed()


def test_a_reservation_released_mid_stream_stops_the_writes(decode):
    request_id = fresh_id(decode, "expired")
    token = decode.reserve(request_id, [29], GRPC).write_token
    before = decode.pool()

    async def chunks():
        yield chunk(decode, request_id, 0, [29], 5.0, decode.layout, token=token)
        await asyncio.to_thread(decode.release, request_id)
        yield chunk(decode, request_id, 1, [29], 5.0, token=token)
        yield chunk(decode, request_id, 2, [29], 5.0, last=True, token=token)

    code, _ = asyncio.run(push(decode.endpoint, chunks()))
    assert code == grpc.StatusCode.NOT_FOUND
    after = decode.pool()
    assert torch.equal(after[1:, :, 29].view(torch.uint8), before[1:, :, 29].view(torch.uint8))
    assert request_id not in decode.landed()


def test_cuda_ipc_is_unavailable_here_rather_than_a_quiet_fallback(decode):
    with pytest.raises(TransportUnavailableError, match="CUDA"):
        decode.reserve(fresh_id(decode, "cuda"), [1], common_pb2.TRANSPORT_CUDA_IPC)
    if not torch.cuda.is_available():
        with pytest.raises(TransportUnavailableError, match="CUDA"):
            create_sender(common_pb2.TRANSPORT_CUDA_IPC, decode.layout)


def test_the_decode_replica_unlinks_its_pool_and_prefill_views_stay_valid():
    config = LoopbackConfig(spec_of(torch.float32), 4, "cpu", MODEL, call_timeout_s=20.0)
    with LoopbackDecode(config) as decode:
        target = decode.reserve("r", [0], SHM)
        view = map_shared_pool(target.shm_name, config.spec, config.num_blocks)
        view[0, 0, 0] = 1.5
        assert torch.all(decode.pool()[0, 0, 0] == 1.5)
        assert os.path.exists(os.path.join(SHM_DIR, target.shm_name))
    assert not os.path.exists(os.path.join(SHM_DIR, target.shm_name))
    assert torch.all(view[0, 0, 0] == 1.5)  # still mapped here, until this view is dropped


def test_grpc_push_sends_each_layer_as_it_is_announced_and_lands_only_after_the_last(decode):
    kv = prefill_pool(decode, seed=5)
    src, dst = [4, 9], [18, 19]
    request_id = fresh_id(decode, "layered")
    target = decode.reserve(request_id, dst, GRPC)
    num_layers = decode.config.spec.num_layers

    async def push_while_layers_complete():
        sender = GrpcSender(decode.layout, rpc_timeout_s=20.0)
        announced: asyncio.Queue[int] = asyncio.Queue()

        async def layers():
            for _ in range(num_layers):
                yield await announced.get()

        push = asyncio.create_task(sender.send(request_id, kv, src, target, layers_ready=layers()))
        try:
            for layer in range(num_layers):
                await asyncio.sleep(0.3)  # "computing" layer `layer`
                assert not push.done() and request_id not in decode.landed()
                announced.put_nowait(layer)
            return await push
        finally:
            await sender.close()

    result = asyncio.run(push_while_layers_complete())
    assert torch.equal(decode.pool()[:, :, dst], kv[:, :, src])
    assert decode.landed()[request_id] == result.num_bytes
