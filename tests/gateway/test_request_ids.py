"""Request ids: a client's is 1 to 128 characters of [A-Za-z0-9-_.:], and the ids the gateway
makes for a migrated request's attempts are never one, so no client can name or collide with
another request's attempt on a replica."""
import pytest

from pdserve.gateway.front.request_ids import MAX_REQUEST_ID_CHARS, attempt_request_id, check_client_request_id
from pdserve.protocol.errors import InvalidRequestError

VALID = ["r", "trace-42", "a.b:c_d-E9", "x" * MAX_REQUEST_ID_CHARS, "0f" * 16]


@pytest.mark.parametrize("request_id", VALID)
def test_a_client_may_give_an_id_of_the_safe_alphabet_up_to_128_characters(request_id):
    assert check_client_request_id(request_id, "request_id") == request_id


@pytest.mark.parametrize("request_id", ["", "x" * (MAX_REQUEST_ID_CHARS + 1), "a b", "r1#1", "é", "a/b", "k\n"])
def test_any_other_id_is_refused_naming_the_field(request_id):
    with pytest.raises(InvalidRequestError, match="^X-Request-Id must be 1 to 128 characters"):
        check_client_request_id(request_id, "X-Request-Id")


@pytest.mark.parametrize("request_id", VALID)
def test_no_attempt_id_is_an_id_a_client_may_give(request_id):
    for num_migrations in (1, 2, 10):
        attempt_id = attempt_request_id(request_id, num_migrations)
        assert attempt_id.startswith(request_id)
        with pytest.raises(InvalidRequestError):
            check_client_request_id(attempt_id, "request_id")
