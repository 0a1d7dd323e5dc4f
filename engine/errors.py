"""Typed domain errors.

Domain code raises these; only the service edge turns them into gRPC status codes or HTTP
responses. Each error also subclasses the builtin it refines, so callers that only know the
builtin still catch it.
"""


class PdserveError(Exception):
    """Base class of every error pdserve raises on purpose."""


class InvalidRequestError(PdserveError, ValueError):
    """A request asked for something that cannot be served as asked (the client's fault)."""


class InvalidModelError(PdserveError, ValueError):
    """A model folder cannot be served: missing files, an unsupported architecture or feature."""


class InvalidConfigError(PdserveError, ValueError):
    """An engine or service configuration value is out of range or inconsistent."""


class PreconditionError(PdserveError):
    """The request is well-formed but the system is not in the state it needs (e.g. its KV has
    not landed, or its reservation expired)."""


class IllegalTransitionError(PdserveError, RuntimeError):
    """A lifecycle was asked to move to a state its current state does not lead to (a bug)."""
