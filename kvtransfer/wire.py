"""Protobuf <-> domain for the KV types that travel in other services' messages: `KVLayout`
(in KVChunk, KVCommit and KVTarget) and `KVTarget` (Decode.Reserve, Prefill.Run)."""
from __future__ import annotations

from dataclasses import fields

from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.target import KVTarget
from pdserve.v1 import common_pb2, kv_transfer_pb2

_LAYOUT_FIELDS = tuple(field.name for field in fields(KVLayout))


def layout_to_proto(layout: KVLayout) -> common_pb2.KVLayout:
    return common_pb2.KVLayout(**{name: getattr(layout, name) for name in _LAYOUT_FIELDS})


def layout_from_proto(msg: common_pb2.KVLayout) -> KVLayout:
    return KVLayout(**{name: getattr(msg, name) for name in _LAYOUT_FIELDS})


def target_to_proto(target: KVTarget) -> kv_transfer_pb2.KVTarget:
    return kv_transfer_pb2.KVTarget(
        request_id=target.request_id, decode_replica=target.decode_replica, kv_endpoint=target.kv_endpoint,
        block_ids=target.block_ids, layout=layout_to_proto(target.layout), transport=target.transport,
        shm_name=target.shm_name, cuda_ipc_handle=target.cuda_ipc_handle, cuda_device=target.cuda_device,
        pool_num_blocks=target.pool_num_blocks, deadline_unix_s=target.deadline_unix_s or 0.0,
        num_cached_blocks=target.num_cached_blocks,
        write_token=target.write_token, fence_name=target.fence_name, fence_generation=target.fence_generation,
    )


def target_from_proto(msg: kv_transfer_pb2.KVTarget) -> KVTarget:
    return KVTarget(
        request_id=msg.request_id, block_ids=tuple(msg.block_ids), layout=layout_from_proto(msg.layout),
        transport=msg.transport, decode_replica=msg.decode_replica, kv_endpoint=msg.kv_endpoint,
        pool_num_blocks=msg.pool_num_blocks, deadline_unix_s=msg.deadline_unix_s or None,
        shm_name=msg.shm_name, cuda_ipc_handle=msg.cuda_ipc_handle, cuda_device=msg.cuda_device,
        num_cached_blocks=msg.num_cached_blocks,
        write_token=msg.write_token, fence_name=msg.fence_name, fence_generation=msg.fence_generation,
    )
