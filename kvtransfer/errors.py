"""Errors of the KV transfer layer.

Torch-free and grpc-free, so that pure policy (transport choice) can raise them too.
"""
from pdserve.engine.errors import PdserveError, PreconditionError, UnavailableError


class LayoutMismatchError(PreconditionError, ValueError):
    """Two sides disagree on the KV layout; writing would silently corrupt the decode pool."""


class TransferError(UnavailableError, RuntimeError):
    """A KV transfer did not complete: the decode side refused it, was unreachable or timed out."""


class WriteTokenError(PdserveError):
    """A KV write does not carry its reservation's write token; nothing is written."""


class TransportUnavailableError(PreconditionError, RuntimeError):
    """The requested transport cannot work between these two replicas; there is no fallback."""
