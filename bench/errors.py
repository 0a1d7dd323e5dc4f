"""Errors the benchmark raises on purpose (a request that fails is a record, never an error)."""
from pdserve.protocol.errors import PdserveError


class BenchConfigError(PdserveError, ValueError):
    """A benchmark configuration or dataset cannot be run as given."""
