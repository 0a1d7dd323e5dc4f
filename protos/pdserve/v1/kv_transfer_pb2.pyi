from pdserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KVTarget(_message.Message):
    __slots__ = ("request_id", "decode_replica", "kv_endpoint", "block_ids", "layout", "transport", "shm_name", "cuda_ipc_handle", "cuda_device", "pool_num_blocks", "deadline_unix_s", "write_token", "num_cached_blocks", "fence_name", "fence_generation")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_REPLICA_FIELD_NUMBER: _ClassVar[int]
    KV_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    CUDA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    POOL_NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    WRITE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FENCE_NAME_FIELD_NUMBER: _ClassVar[int]
    FENCE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    decode_replica: str
    kv_endpoint: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    layout: _common_pb2.KVLayout
    transport: _common_pb2.Transport
    shm_name: str
    cuda_ipc_handle: bytes
    cuda_device: int
    pool_num_blocks: int
    deadline_unix_s: float
    write_token: bytes
    num_cached_blocks: int
    fence_name: str
    fence_generation: int
    def __init__(self, request_id: _Optional[str] = ..., decode_replica: _Optional[str] = ..., kv_endpoint: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., transport: _Optional[_Union[_common_pb2.Transport, str]] = ..., shm_name: _Optional[str] = ..., cuda_ipc_handle: _Optional[bytes] = ..., cuda_device: _Optional[int] = ..., pool_num_blocks: _Optional[int] = ..., deadline_unix_s: _Optional[float] = ..., write_token: _Optional[bytes] = ..., num_cached_blocks: _Optional[int] = ..., fence_name: _Optional[str] = ..., fence_generation: _Optional[int] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("request_id", "layout", "layer", "block_ids", "key", "value", "last", "write_token")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    WRITE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    layout: _common_pb2.KVLayout
    layer: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    key: bytes
    value: bytes
    last: bool
    write_token: bytes
    def __init__(self, request_id: _Optional[str] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., layer: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., last: _Optional[bool] = ..., write_token: _Optional[bytes] = ...) -> None: ...

class KVCommit(_message.Message):
    __slots__ = ("request_id", "layout", "num_bytes", "write_token")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    WRITE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    layout: _common_pb2.KVLayout
    num_bytes: int
    write_token: bytes
    def __init__(self, request_id: _Optional[str] = ..., layout: _Optional[_Union[_common_pb2.KVLayout, _Mapping]] = ..., num_bytes: _Optional[int] = ..., write_token: _Optional[bytes] = ...) -> None: ...

class KVAck(_message.Message):
    __slots__ = ("request_id", "num_bytes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_bytes: int
    def __init__(self, request_id: _Optional[str] = ..., num_bytes: _Optional[int] = ...) -> None: ...
