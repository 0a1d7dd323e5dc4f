"""The gRPC sender encodes its `KVChunk`s by hand, payload appended to the encoded header: the
bytes must be the very message protobuf would have encoded, so any receiver parses them."""
import pytest
import torch

from engine.kv_cache import KVCacheSpec
from kvtransfer.grpc_stream import _encode_chunk, _field_prefix
from pdserve.v1 import kv_transfer_pb2

SPEC = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.bfloat16)


@pytest.mark.parametrize("num_bytes", [1, 127, 128, 16_383, 16_384, 3 * 2**20 + 5])
def test_a_field_prefix_is_what_protobuf_writes_before_a_bytes_field(num_bytes):
    payload = b"\x07" * num_bytes
    encoded = kv_transfer_pb2.KVChunk(value=payload).SerializeToString()
    assert encoded == _field_prefix(kv_transfer_pb2.KVChunk.VALUE_FIELD_NUMBER, num_bytes) + payload


def test_an_encoded_chunk_parses_as_the_header_with_the_blocks_of_its_layer_as_key_and_value():
    kv_cache = torch.randn(SPEC.shape(6)).to(SPEC.dtype)
    header = kv_transfer_pb2.KVChunk(request_id="r", layer=1, block_ids=[9, 4, 5], last=True)
    chunk = kv_transfer_pb2.KVChunk.FromString(_encode_chunk(header, kv_cache, 1, [5, 2, 3]))
    assert (chunk.request_id, chunk.layer, list(chunk.block_ids), chunk.last) == ("r", 1, [9, 4, 5], True)
    for kv, data in ((0, chunk.key), (1, chunk.value)):
        blocks = torch.frombuffer(bytearray(data), dtype=SPEC.dtype).view(3, *SPEC.block_shape)
        assert torch.equal(blocks, kv_cache[1, kv, [5, 2, 3]])
