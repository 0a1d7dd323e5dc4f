"""Every malformed request is refused by name on both public fronts, and the front answers the
next good request: HTTP 400 with OpenAI's JSON error body naming the field, gRPC
INVALID_ARGUMENT with a message naming it. The verdicts come from one set of checks
(`SamplingParams`, `GenerateInput`), so where both fronts can express a value they agree.

Some values only one front can spell: JSON has no widths (seed 2**64, n 0), protobuf has no
untyped fields (messages that are not a list) and no strings that are not UTF-8 (a lone
surrogate is malformed bytes there). Such a row has None for the other front.
"""
import math
from dataclasses import dataclass

import grpc
import pytest

from pdserve.v1 import common_pb2, gateway_pb2

GOOD_COMPLETION = {"prompt": " Hello", "max_tokens": 2}
GOOD_CHAT = {"messages": [{"role": "user", "content": " Hello"}], "max_tokens": 2}


def nested(depth: int) -> bytes:
    return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"


def generate_bytes(**fields) -> bytes:
    params = fields.pop("params", {})
    return gateway_pb2.GenerateRequest(
        prompt=" Hello", params=common_pb2.SamplingParams(max_tokens=2, **params), **fields).SerializeToString()


def prompt_bytes(utf8: bytes) -> bytes:
    """A GenerateRequest whose prompt (field 2) holds `utf8` as it is, valid UTF-8 or not."""
    return bytes([2 << 3 | 2, len(utf8)]) + utf8


def chat_bytes(role: str, content: bytes) -> bytes:
    """A GenerateRequest whose one chat message has `content` as it is, valid UTF-8 or not."""
    message = bytes([1 << 3 | 2, len(role)]) + role.encode() + bytes([2 << 3 | 2, len(content)]) + content
    messages = bytes([1 << 3 | 2, len(message)]) + message
    return bytes([4 << 3 | 2, len(messages)]) + messages


LONE_SURROGATE_UTF8 = b"\xed\xa0\x80"  # U+D800 encoded as if it were a character: not UTF-8
MALFORMED = "not a valid pdserve.v1.GenerateRequest"


@dataclass(frozen=True)
class Row:
    kind: str
    http: dict | bytes | None  # a JSON body, raw body bytes, or None where JSON cannot say it
    param: str | None  # the field the HTTP error names (None: the body as a whole)
    grpc: bytes | None  # a serialized request, or None where protobuf cannot say it
    fragment: str  # what the HTTP error message contains
    grpc_fragment: str | None = None  # what the gRPC message contains, where grpc is set
    path: str = "/v1/completions"
    content_type: str = "application/json"


ROWS = [
    Row("seed 2**64", {**GOOD_COMPLETION, "seed": 2**64}, "seed", None, "seed="),
    Row("seed -1", {**GOOD_COMPLETION, "seed": -1}, "seed", None, "seed=-1"),
    Row("top_k 2**31", {**GOOD_COMPLETION, "top_k": 2**31}, "top_k",
        generate_bytes(params={"top_k": 2**31}), f"top_k={2**31}", f"params.top_k={2**31}"),
    Row("top_k -2 (uint32 on gRPC: 2**32 - 2)", {**GOOD_COMPLETION, "top_k": -2}, "top_k",
        generate_bytes(params={"top_k": 2**32 - 2}), "top_k=-2", f"params.top_k={2**32 - 2}"),
    Row("stop_token_ids [2**32] (gRPC: 2**31)", {**GOOD_COMPLETION, "stop_token_ids": [2**32]}, "stop_token_ids",
        generate_bytes(params={"stop_token_ids": [2**31]}), "stop_token_ids=", "params.stop_token_ids="),
    Row("logit_bias id 99999999999 (gRPC: -1)", {**GOOD_COMPLETION, "logit_bias": {"99999999999": 1}}, "logit_bias",
        generate_bytes(params={"logit_bias": {-1: 1.0}}), "99999999999", "params.logit_bias="),
    Row("max_tokens 2**40", {**GOOD_COMPLETION, "max_tokens": 2**40}, "max_tokens", None, "max_tokens="),
    Row("max_completion_tokens 2**40", {**GOOD_CHAT, "max_completion_tokens": 2**40}, "max_completion_tokens",
        None, "max_completion_tokens=", path="/v1/chat/completions"),
    Row("n 0", {**GOOD_COMPLETION, "n": 0}, "n", None, "n=0"),
    Row("n 10**6", {**GOOD_COMPLETION, "n": 10**6}, "n", None, "n=1000000"),
    Row("temperature 1e400", b'{"prompt": " Hello", "temperature": 1e400}', "temperature",
        generate_bytes(params={"temperature": math.inf}), "temperature=inf", "params.temperature=inf"),
    Row("temperature Infinity", {**GOOD_COMPLETION, "temperature": math.inf}, "temperature",
        generate_bytes(params={"temperature": -math.inf}), "temperature=inf", "params.temperature=-inf"),
    Row("temperature NaN", {**GOOD_COMPLETION, "temperature": math.nan}, "temperature",
        generate_bytes(params={"temperature": math.nan}), "temperature=nan", "params.temperature=nan"),
    Row("temperature 1e300 (inf in float32)", {**GOOD_COMPLETION, "temperature": 1e300}, "temperature",
        None, "temperature=1e+300"),
    Row("presence_penalty NaN", {**GOOD_COMPLETION, "presence_penalty": math.nan}, "presence_penalty",
        generate_bytes(params={"presence_penalty": math.nan}), "presence_penalty=nan", "params.presence_penalty=nan"),
    Row("top_p 2", {**GOOD_COMPLETION, "top_p": 2}, "top_p", generate_bytes(params={"top_p": 2.0}), "top_p=2", "params.top_p=2.0"),
    Row("lone surrogate in prompt", {**GOOD_COMPLETION, "prompt": "a\ud800"}, "prompt",
        prompt_bytes(b"a" + LONE_SURROGATE_UTF8), "prompt: character 1 is a lone UTF-16 surrogate", MALFORMED),
    Row("lone surrogate in a chat message", {**GOOD_CHAT, "messages": [{"role": "user", "content": "\udfff"}]},
        "messages", chat_bytes("user", LONE_SURROGATE_UTF8), "messages[0].content: character 0 is a lone", MALFORMED,
        path="/v1/chat/completions"),
    Row("lone surrogate in a stop string", {**GOOD_COMPLETION, "stop": ["\ud800"]}, "stop", None, "stop[0]: character 0 is a lone"),
    Row("JSON nested 10000 deep", nested(10000), None, None, "nests deeper than 64"),
    Row("JSON nested 100 deep", nested(100), "prompt", None, "nests deeper than 64"),
    Row("body not an object", ["hi"], None, None, "JSON object"),
    Row("body not JSON", b'{"prompt": " Hello",', None, None, "not valid JSON"),
    Row("wrong content type", b'{"prompt": " Hello"}', "Content-Type", None, "text/plain",
        content_type="text/plain"),
    Row("empty chat role", {**GOOD_CHAT, "messages": [{"role": "", "content": " Hello"}]}, "messages",
        chat_bytes("", b" Hello"), "messages[0].role=''", "chat.messages[0].role=''", path="/v1/chat/completions"),
    Row("no chat messages", {**GOOD_CHAT, "messages": []}, "messages",
        gateway_pb2.GenerateRequest(chat=gateway_pb2.ChatMessages()).SerializeToString(), "messages",
        "chat.messages=[]", path="/v1/chat/completions"),
    Row("messages not a list", {**GOOD_CHAT, "messages": "hi"}, "messages", None, "messages",
        path="/v1/chat/completions"),
    Row("prompt of the wrong type", {**GOOD_COMPLETION, "prompt": 5}, "prompt", None, "prompt"),
    Row("no prompt at all", {"max_tokens": 2}, "prompt",
        gateway_pb2.GenerateRequest().SerializeToString(), "prompt is required", "give one of prompt"),
    Row("malformed protobuf bytes", None, None, b"\xff\xff\xff\xff", "", MALFORMED),
    # On HTTP the id is a header (X-Request-Id), refused the same way (test_openai_choices.py).
    Row("request_id of a migrated attempt's form", None, None, generate_bytes(request_id="r1#1"), "",
        "request_id must be 1 to 128 characters of [A-Za-z0-9-_.:]"),
    Row("request_id of 129 characters", None, None, generate_bytes(request_id="r" * 129), "",
        "request_id must be 1 to 128 characters"),
]


@pytest.mark.parametrize("row", [row for row in ROWS if row.http is not None], ids=lambda row: row.kind)
def test_http_refuses_the_request_naming_the_field_then_serves_a_good_one(server, row):
    body = row.http if isinstance(row.http, bytes) else None
    response = server.request(
        "POST", row.path, json_body=None if body else row.http, raw_body=body, content_type=row.content_type)

    assert response.status == 400, response.text
    assert response.content_type.startswith("application/json")
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", row.param)
    assert row.fragment in error["message"]
    if row.param is not None:
        assert row.param in error["message"]
    good = GOOD_CHAT if row.path.endswith("chat/completions") else GOOD_COMPLETION
    assert server.request("POST", row.path, json_body=good).status == 200


@pytest.mark.parametrize("row", [row for row in ROWS if row.grpc is not None], ids=lambda row: row.kind)
def test_grpc_refuses_the_request_as_invalid_argument_naming_the_field_then_serves_a_good_one(grpc_gateway, row):
    generate, _ = grpc_gateway
    with pytest.raises(grpc.RpcError) as raised:
        generate(row.grpc)

    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert row.grpc_fragment in raised.value.details()
    chunks = generate(generate_bytes())
    assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH


def test_top_k_0_means_off_on_both_fronts(server, grpc_gateway):
    assert server.request("POST", "/v1/completions", json_body={**GOOD_COMPLETION, "top_k": 0}).status == 200
    assert server.frontend.inputs[-1].params.top_k is None
    generate, grpc_frontend = grpc_gateway
    assert generate(generate_bytes(params={"top_k": 0}))[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert grpc_frontend.inputs[-1].params.top_k is None
