"""Typed domain errors.

Domain code raises these; only the service edge turns them into gRPC status codes or HTTP
responses. Each error also subclasses the builtin it refines, so callers that only know the
builtin still catch it.

The categories below say what a client sees; every error meant to reach a client subclasses
exactly one, and the edge maps only the categories (cluster.grpc_errors):

    InvalidRequestError      INVALID_ARGUMENT     the client's fault: do not retry as is
    PreconditionError        FAILED_PRECONDITION  well-formed, but the system is not in the state it needs
    ResourceExhaustedError   RESOURCE_EXHAUSTED   out of capacity (KV blocks)
    UnavailableError         UNAVAILABLE          a replica, engine or transfer is down: retry later
    NotFoundError            NOT_FOUND            no such request (or it expired)
    AbortedError             ABORTED              the request was aborted while being served

A `PdserveError` in no category is a bug when it reaches the edge (INTERNAL).
"""


class PdserveError(Exception):
    """Base class of every error pdserve raises on purpose."""


class InvalidRequestError(PdserveError, ValueError):
    """A request asked for something that cannot be served as asked (the client's fault)."""


class PreconditionError(PdserveError):
    """The request is well-formed but the system is not in the state it needs (e.g. its KV has
    not landed, or its reservation expired)."""


class ResourceExhaustedError(PdserveError):
    """The request needs more of a bounded resource than is free now."""


class UnavailableError(PdserveError):
    """A service the request needs is down or unreachable; a retry may succeed."""


class NotFoundError(PdserveError, LookupError):
    """The thing the request names does not exist (or no longer does)."""


class AbortedError(PdserveError):
    """The request was aborted while it was being served."""


class InvalidModelError(PdserveError, ValueError):
    """A model folder cannot be served: missing files, an unsupported architecture or feature."""


class InvalidConfigError(PdserveError, ValueError):
    """An engine or service configuration value is out of range or inconsistent."""


class IllegalTransitionError(PdserveError, RuntimeError):
    """A lifecycle was asked to move to a state its current state does not lead to (a bug)."""


# The KV transfer layer's errors: torch-free and grpc-free, so pure policy (transport choice) raises
# them too.


class LayoutMismatchError(PreconditionError, ValueError):
    """Two sides disagree on the KV layout; writing would silently corrupt the decode pool."""


class TransferError(UnavailableError, RuntimeError):
    """A KV transfer did not complete: the decode side refused it, was unreachable or timed out.

    `failed_side` names the replica at fault. The prefill replica reports it with the error
    (cluster.grpc_errors), so that the gateway moves the request off that replica, not the other."""

    failed_side = "decode"


class PrefillKVError(TransferError):
    """The prefill replica cannot send its own KV (its pool or its block ids are not what its
    layout says), whichever decode replica it sends to."""

    failed_side = "prefill"


class WriteTokenError(PdserveError):
    """A KV write does not carry its reservation's write token; nothing is written."""


class TransportUnavailableError(PreconditionError, RuntimeError):
    """The requested transport cannot work between these two replicas; there is no fallback."""
