"""The layout handshake: what prefill and decode must agree on before one KV byte moves.

A layout names the model, the element type and every dimension of a KV block; its fingerprint
is a hash of exactly those fields, so equal fingerprints mean byte-compatible blocks. Any
difference is a `LayoutMismatchError` that names each differing field with both values.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdserve.protocol.errors import LayoutMismatchError

if TYPE_CHECKING:
    from pdserve.engine.kv_cache import KVCacheSpec

__all__ = ["LAYOUT_VERSION", "KVLayout", "LayoutMismatchError", "check_layout", "dtype_name", "make_layout"]

# Bumped whenever the pool's memory layout (see engine/kv_cache.py) changes meaning.
LAYOUT_VERSION = 1

_FINGERPRINT_HEX_CHARS = 16
_COMPARED_FIELDS = (
    "model", "dtype", "num_layers", "num_kv_heads", "head_dim", "block_size", "layout_version",
)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The fields of `KVCacheSpec` plus the model and the layout version; `KVCacheSpec.from_layout`
    reads it back. On the wire: `pdserve.v1.KVLayout` (see kvtransfer/wire.py)."""

    model: str
    dtype: str  # "bfloat16"
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    layout_version: int
    fingerprint: str  # hash of the fields above


def dtype_name(dtype: object) -> str:
    """`torch.bfloat16` -> "bfloat16", without importing torch."""
    return str(dtype).removeprefix("torch.")


def _fingerprint(fields: dict[str, object]) -> str:
    canonical = "|".join(f"{field}={fields[field]}" for field in _COMPARED_FIELDS)
    return hashlib.sha256(canonical.encode()).hexdigest()[:_FINGERPRINT_HEX_CHARS]


def make_layout(model_name: str, spec: KVCacheSpec) -> KVLayout:
    fields = {
        "model": model_name,
        "dtype": dtype_name(spec.dtype),
        "num_layers": spec.num_layers,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "block_size": spec.block_size,
        "layout_version": LAYOUT_VERSION,
    }
    return KVLayout(**fields, fingerprint=_fingerprint(fields))


def check_layout(
    local: KVLayout,
    remote: KVLayout,
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
