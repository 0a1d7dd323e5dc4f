"""The layout handshake: what prefill and decode must agree on before one KV byte moves.

A layout names the model, the element type and every dimension of a KV block; its fingerprint
is a hash of exactly those fields, so equal fingerprints mean byte-compatible blocks. Any
difference is a `LayoutMismatchError` that names each differing field with both values.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from kvtransfer.errors import LayoutMismatchError
from pdserve.v1 import common_pb2

if TYPE_CHECKING:
    from engine.kv_cache import KVCacheSpec

__all__ = ["LAYOUT_VERSION", "LayoutMismatchError", "check_layout", "dtype_name", "make_layout"]

# Bumped whenever the pool's memory layout (see engine/kv_cache.py) changes meaning.
LAYOUT_VERSION = 1

_FINGERPRINT_HEX_CHARS = 16
_COMPARED_FIELDS = (
    "model", "dtype", "num_layers", "num_kv_heads", "head_dim", "block_size", "layout_version",
)


def dtype_name(dtype: object) -> str:
    """`torch.bfloat16` -> "bfloat16", without importing torch."""
    return str(dtype).removeprefix("torch.")


def fingerprint(layout: common_pb2.KVLayout) -> str:
    canonical = "|".join(f"{field}={getattr(layout, field)}" for field in _COMPARED_FIELDS)
    return hashlib.sha256(canonical.encode()).hexdigest()[:_FINGERPRINT_HEX_CHARS]


def make_layout(model_name: str, spec: KVCacheSpec) -> common_pb2.KVLayout:
    layout = common_pb2.KVLayout(
        model=model_name,
        dtype=dtype_name(spec.dtype),
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        block_size=spec.block_size,
        layout_version=LAYOUT_VERSION,
    )
    layout.fingerprint = fingerprint(layout)
    return layout


def check_layout(
    local: common_pb2.KVLayout,
    remote: common_pb2.KVLayout,
    local_role: str = "local",
    remote_role: str = "remote",
) -> None:
    """Raises LayoutMismatchError unless both layouts, fingerprints included, are equal."""
    differences = [
        f"{field} {getattr(local, field)!r} ({local_role}) != {getattr(remote, field)!r} ({remote_role})"
        for field in _COMPARED_FIELDS
        if getattr(local, field) != getattr(remote, field)
    ]
    if not differences and local.fingerprint != remote.fingerprint:
        differences.append(
            f"fingerprint {local.fingerprint!r} ({local_role}) != {remote.fingerprint!r} ({remote_role})"
        )
    if differences:
        raise LayoutMismatchError("KV layout mismatch: " + "; ".join(differences))
