"""Every domain error reaches a gRPC client with the status of its category; a downstream
replica's status passes through; anything else is INTERNAL (no status of its own)."""
import grpc
import pytest

from pdserve.cluster.grpc_errors import status_for
from pdserve.decode_svc.reservations import ReservationError
from pdserve.engine.async_engine import EngineDeadError
from pdserve.engine.block_allocator import OutOfBlocksError
from pdserve.protocol.errors import (AbortedError, InvalidConfigError, InvalidRequestError, LayoutMismatchError,
                                     PdserveError, PreconditionError, TransferError, TransportUnavailableError)
from pdserve.gateway.disaggregated.backend_errors import BackendError
from pdserve.gateway.front.frontend_types import UnavailableError
from pdserve.gateway.disaggregated.request_store import RequestExistsError, RequestNotFoundError

Code = grpc.StatusCode


@pytest.mark.parametrize(("error_type", "code"), [
    (InvalidRequestError, Code.INVALID_ARGUMENT),
    (RequestExistsError, Code.INVALID_ARGUMENT),
    (LayoutMismatchError, Code.FAILED_PRECONDITION),
    (TransportUnavailableError, Code.FAILED_PRECONDITION),
    (PreconditionError, Code.FAILED_PRECONDITION),
    (ReservationError, Code.FAILED_PRECONDITION),
    (OutOfBlocksError, Code.RESOURCE_EXHAUSTED),
    (TransferError, Code.UNAVAILABLE),
    (EngineDeadError, Code.UNAVAILABLE),
    (UnavailableError, Code.UNAVAILABLE),
    (AbortedError, Code.ABORTED),
    (TimeoutError, Code.DEADLINE_EXCEEDED),
    (RequestNotFoundError, Code.NOT_FOUND),
])
def test_a_domain_error_gets_the_status_of_its_category_and_keeps_its_message(error_type, code):
    assert status_for(error_type("what went wrong")) == (code, "what went wrong")


def test_an_error_carrying_a_downstream_status_keeps_that_status():
    assert status_for(BackendError(Code.RESOURCE_EXHAUSTED, "decode-0: full")) == (
        Code.RESOURCE_EXHAUSTED, "decode-0: full")


@pytest.mark.parametrize("error", [PdserveError("bug"), InvalidConfigError("bad"), RuntimeError("bug")])
def test_an_error_of_no_category_has_no_status(error):
    assert status_for(error) is None
