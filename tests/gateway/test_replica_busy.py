"""A replica at one of its bounds (RESOURCE_EXHAUSTED: out of blocks, or its waiting queue full)
reaches the client as the gateway's own admission bound does: HTTP 429 with Retry-After and
OpenAI's rate-limit error (an SSE error event once the stream has started), gRPC
RESOURCE_EXHAUSTED with a `retry-after` trailer."""
import json

import grpc
import pytest

from pdserve.gateway.disaggregated.backend_errors import ReplicaBusyError, backend_error
from pdserve.gateway.front.frontend_types import RETRY_AFTER_S
from pdserve.v1 import common_pb2, gateway_pb2

from .conftest import BUSY, BUSY_MESSAGE, BUSY_MIDWAY


def test_a_replicas_resource_exhausted_is_a_replica_busy_error_to_retry_after_a_while():
    error = backend_error("p0", grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "the waiting queue is full")
    assert isinstance(error, ReplicaBusyError)
    assert (error.replica_id, str(error), error.retry_after_s) == ("p0", "p0: the waiting queue is full", RETRY_AFTER_S)


@pytest.mark.parametrize("stream", [False, True])
def test_http_answers_a_busy_replica_with_429_and_retry_after(server, stream):
    response = server.request("POST", "/v1/completions", json_body={"prompt": BUSY, "stream": stream})
    assert response.status == 429 and response.headers["Retry-After"] == str(RETRY_AFTER_S)
    error = response.json()["error"]
    assert (error["code"], error["type"], error["message"]) == ("rate_limit_exceeded", "rate_limit_error", BUSY_MESSAGE)


def test_a_replica_busy_mid_stream_ends_the_stream_with_a_rate_limit_event(server):
    response = server.request("POST", "/v1/completions",
                              json_body={"prompt": BUSY_MIDWAY, "max_tokens": 5, "stream": True})
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert response.status == 200 and events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["code"], error["message"]) == ("rate_limit_exceeded", BUSY_MESSAGE)


def test_grpc_answers_a_busy_replica_with_resource_exhausted_and_a_retry_after_trailer(grpc_gateway):
    generate, _ = grpc_gateway
    request = gateway_pb2.GenerateRequest(prompt=BUSY, params=common_pb2.SamplingParams(max_tokens=2))
    with pytest.raises(grpc.RpcError) as refused:
        generate(request.SerializeToString())
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details() == BUSY_MESSAGE
    assert ("retry-after", str(RETRY_AFTER_S)) in tuple(refused.value.trailing_metadata())
