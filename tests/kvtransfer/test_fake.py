"""The in-memory fake behaves like the real transports where other components' tests look:
same checks before sending, refusal without a reservation, landing through the reservations."""
import asyncio

import pytest
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.protocol.errors import NotFoundError, LayoutMismatchError, TransferError, WriteTokenError
from pdserve.kvtransfer.layout import make_layout
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.testing.fake import FakeKVReceiver, FakeKVSender
from pdserve.v1 import common_pb2

SPEC = KVCacheSpec(num_layers=2, num_kv_heads=1, head_dim=4, block_size=2, dtype=torch.float32)
LAYOUT = make_layout("m", SPEC)
GRPC = common_pb2.TRANSPORT_GRPC


class Reservations:
    def __init__(self, table):
        self.table, self.landed = table, {}

    def begin_write(self, request_id, write_token):
        if request_id not in self.table:
            raise NotFoundError(f"request {request_id} holds no KV reservation")
        if write_token != b"token":
            raise WriteTokenError("wrong write token")
        return self.table[request_id]

    def end_write(self, request_id):
        pass

    def mark_landed(self, request_id, write_token, num_bytes):
        self.landed[request_id] = num_bytes


def test_fake_delivers_the_blocks_and_marks_them_landed():
    reservations = Reservations({"a": [5, 6]})
    receiver = FakeKVReceiver(LAYOUT, reservations)
    sender = FakeKVSender(receiver, LAYOUT)
    kv = torch.randn(2, 2, 4, 2, 1, 4)
    result = asyncio.run(sender.send("a", kv, [3, 1], KVTarget(request_id="a", block_ids=(5, 6), layout=LAYOUT, transport=GRPC,
                                                                 write_token=b"token")))
    assert torch.equal(receiver.received["a"], kv[:, :, [3, 1]])
    assert reservations.landed == {"a": result.num_bytes} and result.num_bytes == 2 * SPEC.bytes_per_block


def test_fake_refuses_like_the_real_transports():
    reservations = Reservations({})
    sender = FakeKVSender(FakeKVReceiver(LAYOUT, reservations), LAYOUT)
    kv = torch.zeros(2, 2, 4, 2, 1, 4)
    target = KVTarget(request_id="a", block_ids=(0,), layout=LAYOUT, transport=GRPC, write_token=b"token")
    with pytest.raises(TransferError, match="no KV reservation"):
        asyncio.run(sender.send("a", kv, [0], target))
    other = make_layout("m", KVCacheSpec(2, 1, 4, 4, torch.float32))
    with pytest.raises(LayoutMismatchError):
        asyncio.run(sender.send("a", kv, [0], KVTarget(request_id="a", block_ids=(0,), layout=other, transport=GRPC)))
    with pytest.raises(TransferError, match="1 prefill blocks for 2"):
        asyncio.run(sender.send("a", kv, [0], KVTarget(request_id="a", block_ids=(0, 1), layout=LAYOUT, transport=GRPC)))
    reservations.table["a"] = [0]
    with pytest.raises(TransferError, match="write token"):
        asyncio.run(sender.send("a", kv, [0], KVTarget(request_id="a", block_ids=(0,), layout=LAYOUT, transport=GRPC)))
    sender.fail_with = TransferError("injected")
    with pytest.raises(TransferError, match="injected"):
        asyncio.run(sender.send("a", kv, [0], target))
    assert reservations.landed == {}
