"""`KVChunk` bytes with the K and V payload copied once, not by protobuf.

A protobuf message on the wire is the concatenation of its fields, in any order, and a bytes
field is a tag, a varint length and the bytes. So the sender encodes only the chunk's small
header with protobuf and appends `key` and `value` to it, joined straight from the gathered
blocks; the receiver finds the two payload fields in the received message, parses the rest with
protobuf and keeps the payload as views of the message, which the write into the pool reads.
Either end also works against plain protobuf (`KVChunk.SerializeToString` / `FromString`).
"""
from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from pdserve.v1 import kv_transfer_pb2

KEY = kv_transfer_pb2.KVChunk.KEY_FIELD_NUMBER
VALUE = kv_transfer_pb2.KVChunk.VALUE_FIELD_NUMBER
_LENGTH_DELIMITED = 2  # wire type of bytes, strings, messages and packed repeated fields
_FIXED_BYTES = {1: 8, 5: 4}  # wire type -> size, for the fixed-size wire types


@dataclass(frozen=True, slots=True)
class ReceivedChunk:
    header: kv_transfer_pb2.KVChunk  # every field but key and value
    key: memoryview  # [len(block_ids), block_size, num_kv_heads, entry_size], the layout's dtype
    value: memoryview


@dataclass(frozen=True, slots=True)
class MalformedChunk:
    reason: str


def decode_chunk_or_malformed(message: bytes) -> ReceivedChunk | MalformedChunk:
    """`decode_chunk` as a gRPC request deserializer: an exception there would reach the sender as
    INTERNAL, so a malformed message is handed on for the receiver to refuse as INVALID_ARGUMENT."""
    try:
        return decode_chunk(message)
    except (ValueError, DecodeError) as exc:
        return MalformedChunk(str(exc) or "unparsable KVChunk")


def encode_chunk(header: kv_transfer_pb2.KVChunk, key: memoryview, value: memoryview) -> bytes:
    """The encoded `KVChunk` of `header` (no key or value of its own) with `key` and `value`."""
    return b"".join((
        header.SerializeToString(), field_prefix(KEY, key.nbytes), key, field_prefix(VALUE, value.nbytes), value
    ))


def field_prefix(field_number: int, num_bytes: int) -> bytes:
    """The tag and varint length that open a length-delimited field of `num_bytes` bytes."""
    prefix = bytearray(_varint_bytes(field_number << 3 | _LENGTH_DELIMITED))
    prefix += _varint_bytes(num_bytes)
    return bytes(prefix)


def decode_chunk(message: bytes) -> ReceivedChunk:
    """A received `KVChunk`, its payload still in `message`; raises ValueError if it is malformed."""
    view = memoryview(message)
    header_fields: list[memoryview] = []
    payload = {KEY: view[:0], VALUE: view[:0]}  # the last occurrence of a field wins, as in protobuf
    position = 0
    while position < len(view):
        field_start = position
        tag, position = _read_varint(view, position)
        field_number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, position = _read_varint(view, position)
        elif wire_type in _FIXED_BYTES:
            position += _FIXED_BYTES[wire_type]
        elif wire_type == _LENGTH_DELIMITED:
            num_bytes, position = _read_varint(view, position)
            if field_number in payload:
                payload[field_number] = view[position : position + num_bytes]
                position += num_bytes
                continue
            position += num_bytes
        else:
            raise ValueError(f"KVChunk field {field_number} has wire type {wire_type}")
        header_fields.append(view[field_start:position])
    if position != len(view):
        raise ValueError("truncated KVChunk")
    header = kv_transfer_pb2.KVChunk.FromString(b"".join(header_fields))
    return ReceivedChunk(header, payload[KEY], payload[VALUE])


def _varint_bytes(number: int) -> bytes:
    encoded = bytearray()
    while number > 0x7F:
        encoded.append(number & 0x7F | 0x80)
        number >>= 7
    encoded.append(number)
    return bytes(encoded)


def _read_varint(view: memoryview, position: int) -> tuple[int, int]:
    """The varint at `position` and the position after it."""
    number = shift = 0
    while True:
        if position >= len(view):
            raise ValueError("truncated KVChunk")
        byte = view[position]
        number |= (byte & 0x7F) << shift
        position += 1
        if byte < 0x80:
            return number, position
        shift += 7
