"""The gateway's request lifecycle: exactly the moves of the diagram, numbered as the proto enum."""

import pytest

from pdserve.protocol.errors import IllegalTransitionError
from pdserve.gateway.front.request_state import RequestState, transition
from pdserve.v1 import gateway_pb2

Q, P, T, D = RequestState.QUEUED, RequestState.PREFILLING, RequestState.TRANSFERRING, RequestState.DECODING
FINISHED, ABORTED, FAILED = RequestState.FINISHED, RequestState.ABORTED, RequestState.FAILED

LEGAL_MOVES = {
    (Q, P), (P, T), (T, D), (D, FINISHED),
    (P, FINISHED),  # first token is EOS, or max_tokens is 1
    (T, FINISHED),
    (P, D),  # prefilled on the decode replica: no transfer
    *((state, P) for state in (P, T, D)),  # migrated: prefilled again, elsewhere
    *((state, end) for state in (Q, P, T, D) for end in (ABORTED, FAILED)),
}


def test_values_are_the_proto_enum_numbers():
    proto = gateway_pb2.RequestState
    assert {state.name: state.value for state in RequestState} == {
        name.removeprefix("REQUEST_STATE_"): number
        for name, number in proto.items()
        if name != "REQUEST_STATE_UNSPECIFIED"
    }


@pytest.mark.parametrize("current", list(RequestState), ids=lambda s: s.name)
@pytest.mark.parametrize("to", list(RequestState), ids=lambda s: s.name)
def test_exactly_the_legal_moves_are_allowed(current, to):
    if (current, to) in LEGAL_MOVES:
        assert transition(current, to) is to
    else:
        with pytest.raises(IllegalTransitionError, match=f"{current.name} -> {to.name}"):
            transition(current, to)


def test_terminal_states_are_those_nothing_leaves():
    leaves = {current for current, _ in LEGAL_MOVES}
    assert {state for state in RequestState if state.is_terminal} == set(RequestState) - leaves == {
        FINISHED, ABORTED, FAILED
    }
