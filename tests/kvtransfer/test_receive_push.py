"""The decode end of a push, in process: chunks decoded around protobuf (KVReceiver.add_to_server)
and chunks parsed by protobuf (the generated registration) land the same bytes in the same blocks."""
import asyncio
import contextlib

import pytest
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.chunk_wire import decode_chunk
from pdserve.kvtransfer.grpc_stream import _encode_chunk, receive_push
from pdserve.kvtransfer.layout import make_layout
from pdserve.kvtransfer.pool import KVPool
from pdserve.kvtransfer.wire import layout_to_proto
from pdserve.v1 import kv_transfer_pb2

SPEC = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.float16)
RESERVED = [7, 2, 3, 4, 0]  # runs of consecutive ids and single ones


class OneReservation:
    def __init__(self):
        self.landed: dict[str, int] = {}

    def check_layout(self, remote) -> None:
        assert remote == make_layout("m", SPEC)

    @contextlib.contextmanager
    def writing(self, request_id: str, write_token: bytes):
        assert write_token == b"token"
        yield RESERVED

    def land(self, request_id: str, write_token: bytes, num_bytes: int) -> None:
        self.landed[request_id] = num_bytes


@pytest.mark.parametrize("parsed_by_protobuf", [False, True], ids=["decoded", "protobuf"])
def test_pushed_chunks_land_in_the_reserved_blocks_of_each_layer(parsed_by_protobuf):
    kv_cache = torch.randn(SPEC.shape(6)).to(SPEC.dtype)
    src_block_ids = [5, 0, 1, 2, 4]
    encoded = [
        _encode_chunk(
            kv_transfer_pb2.KVChunk(
                request_id="r", layout=layout_to_proto(make_layout("m", SPEC)) if layer == 0 else None,
                layer=layer, block_ids=RESERVED, last=layer == SPEC.num_layers - 1, write_token=b"token",
            ),
            kv_cache, layer, src_block_ids,
        )
        for layer in range(SPEC.num_layers)
    ]
    parse = kv_transfer_pb2.KVChunk.FromString if parsed_by_protobuf else decode_chunk
    pool, end = KVPool(SPEC, SPEC.allocate(8, torch.device("cpu")).zero_()), OneReservation()

    async def chunks():
        for message in encoded:
            yield parse(message)

    ack = asyncio.run(receive_push(chunks(), end, pool))
    assert ack.num_bytes == end.landed["r"] == len(RESERVED) * SPEC.bytes_per_block
    assert torch.equal(pool.tensor[:, :, RESERVED], kv_cache[:, :, src_block_ids])
    assert not pool.tensor[:, :, [1, 5, 6]].any()
