"""A client that leaves mid-generation closes the frontend's generator (which aborts the
request) within a deadline, whether it was streaming or waiting for a whole answer."""
import json
import socket
from urllib.parse import urlsplit

import pytest

ABORT_DEADLINE_S = 3.0
REQUEST_ID = "leaving-1"
BOTH_HANDLER_CANCELLATION_MODES = pytest.mark.parametrize(
    "server", [False, True], indirect=True, ids=["poll", "cancel"]
)


def open_generation(server, body: dict) -> socket.socket:
    """Sends one POST /v1/completions (X-Request-Id: REQUEST_ID) on a raw socket, so the test
    decides when it closes."""
    address = urlsplit(server.base_url)
    sock = socket.create_connection((address.hostname, address.port), timeout=5)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Content-Type: application/json\r\nX-Request-Id: {REQUEST_ID}\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


@BOTH_HANDLER_CANCELLATION_MODES
def test_closing_a_stream_closes_the_generation(server):
    sock = open_generation(server, {"prompt": "slow", "stream": True})
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    assert b"200 OK" in received
    sock.close()

    assert server.frontend.closed_early_seen.wait(ABORT_DEADLINE_S)
    assert server.frontend.closed_early == [REQUEST_ID]


@BOTH_HANDLER_CANCELLATION_MODES
def test_leaving_before_a_whole_answer_closes_the_generation(server):
    sock = open_generation(server, {"prompt": "slow", "stream": False})
    assert server.frontend.generation_started.wait(ABORT_DEADLINE_S)
    sock.close()

    assert server.frontend.closed_early_seen.wait(ABORT_DEADLINE_S)
    assert server.frontend.closed_early == [REQUEST_ID]


def test_a_finished_generation_is_not_closed_early(server):
    sock = open_generation(server, {"prompt": "hi", "max_tokens": 2, "stream": True})
    received = b""
    while b"data: [DONE]" not in received:
        received += sock.recv(4096)
    sock.close()

    assert not server.frontend.closed_early_seen.wait(0.3)
