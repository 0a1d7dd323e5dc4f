"""`KVChunk` bytes are encoded and decoded around protobuf, payload copied once: they must be
exactly what protobuf would have written, and decoding must read whatever protobuf writes; a
sender's chunk never outgrows the message limit of pdserve's servers."""
import asyncio

import pytest
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.chunk_wire import decode_chunk, field_prefix
from pdserve.kvtransfer.grpc_stream import CHUNK_HEADER_ROOM_BYTES, DEFAULT_MAX_CHUNK_BYTES, GrpcSender, _encode_chunk
from pdserve.kvtransfer.layout import make_layout
from pdserve.protocol.message_limits import MAX_MESSAGE_BYTES
from pdserve.v1 import common_pb2, kv_transfer_pb2

SPEC = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.bfloat16)
VALUE = kv_transfer_pb2.KVChunk.VALUE_FIELD_NUMBER


@pytest.mark.parametrize("num_bytes", [1, 127, 128, 16_383, 16_384, 3 * 2**20 + 5])
def test_a_field_prefix_is_what_protobuf_writes_before_a_bytes_field(num_bytes):
    payload = b"\x07" * num_bytes
    assert kv_transfer_pb2.KVChunk(value=payload).SerializeToString() == field_prefix(VALUE, num_bytes) + payload


def test_a_sent_chunk_parses_as_its_header_with_the_blocks_of_its_layer_as_key_and_value():
    kv_cache = torch.randn(SPEC.shape(6)).to(SPEC.dtype)
    header = kv_transfer_pb2.KVChunk(request_id="r", layer=1, block_ids=[9, 4, 5], last=True)
    chunk = kv_transfer_pb2.KVChunk.FromString(_encode_chunk(header, kv_cache, 1, [5, 2, 3]))
    assert (chunk.request_id, chunk.layer, list(chunk.block_ids), chunk.last) == ("r", 1, [9, 4, 5], True)
    for kv, data in ((0, chunk.key), (1, chunk.value)):
        blocks = torch.frombuffer(bytearray(data), dtype=SPEC.dtype).view(3, *SPEC.block_shape)
        assert torch.equal(blocks, kv_cache[1, kv, [5, 2, 3]])


def test_decoding_reads_a_chunk_protobuf_encoded_with_the_payload_before_later_fields():
    chunk = kv_transfer_pb2.KVChunk(
        request_id="r", layout=common_pb2.KVLayout(model="m", num_layers=2), layer=1,
        block_ids=[300, 2], key=b"k" * 200, value=b"v" * 200, last=True,
    )
    received = decode_chunk(chunk.SerializeToString())
    assert bytes(received.key) == chunk.key and bytes(received.value) == chunk.value
    chunk.ClearField("key")
    chunk.ClearField("value")
    assert received.header == chunk


def test_a_truncated_chunk_is_malformed():
    encoded = kv_transfer_pb2.KVChunk(request_id="r", key=b"k" * 200).SerializeToString()
    with pytest.raises(ValueError, match="truncated"):
        decode_chunk(encoded[:-1])


def test_a_senders_chunk_fits_its_byte_budget_plus_the_header_room_with_the_largest_block_ids():
    """The budget counts each block's id (a varint of up to 5 bytes) with its K and V, so a chunk
    stays within max_chunk_bytes + CHUNK_HEADER_ROOM_BYTES: with the defaults, the message limit
    of pdserve's servers."""
    max_chunk_bytes = 10 * SPEC.bytes_per_layer_block
    sender = GrpcSender(make_layout("m" * 200, SPEC), rpc_timeout_s=1.0, max_chunk_bytes=max_chunk_bytes)
    kv_cache = torch.zeros(SPEC.shape(64), dtype=SPEC.dtype)
    num_blocks = 40
    decode_block_ids = [2**32 - 1 - i for i in range(num_blocks)]  # the longest varints

    async def encoded() -> list[bytes]:
        chunks = sender._chunks("r" * 1000, kv_cache, list(range(num_blocks)), decode_block_ids, b"t" * 16, None)
        return [chunk async for chunk in chunks]

    chunks = asyncio.run(encoded())
    assert max(map(len, chunks)) <= max_chunk_bytes + CHUNK_HEADER_ROOM_BYTES
    assert max(len(decode_chunk(chunk).header.block_ids) for chunk in chunks) == 9  # 10 would not fit with ids
    assert DEFAULT_MAX_CHUNK_BYTES + CHUNK_HEADER_ROOM_BYTES == MAX_MESSAGE_BYTES
