"""An HTTP request body, decoded: JSON nested at most MAX_JSON_DEPTH deep, every string UTF-8.

JSON can spell what the rest of the gateway cannot take: a lone UTF-16 surrogate ("\\ud800")
decodes to a Python str that neither the tokenizer nor protobuf will encode, and nesting a few
thousand deep exhausts the decoder's recursion. Both are refused here, before the grammar
(`openai_protocol`) sees the body, as an `ApiError` naming the top-level field they sit in.

Python's json also reads NaN, Infinity and numbers beyond a double (1e400 becomes inf); those
pass, and `SamplingParams` refuses them by name wherever a float is expected.
"""
import json

from pdserve.gateway.front.api_error import ApiError

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have; the grammar needs five."""


def decode_json_body(raw: bytes) -> object:
    """The body's JSON value, or ApiError(400) for invalid JSON, too deep a nesting or a
    string that is not valid UTF-8."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # invalid JSON or invalid UTF-8 bytes
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
    _check_value(body)
    return body


def _check_value(body: object) -> None:
    """Walks the value without recursion: (value, where it is, top-level field, depth)."""
    pending: list[tuple[object, str, str | None, int]] = [(body, "", None, 0)]
    while pending:
        value, where, field, depth = pending.pop()
        if isinstance(value, str):
            _check_text(value, where, field)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth == MAX_JSON_DEPTH:
            raise ApiError(400, f"{field or 'the request body'} nests deeper than {MAX_JSON_DEPTH} levels", param=field)
        if isinstance(value, dict):
            for key, item in value.items():
                key_where = f"{where}.{key}" if where else key
                key_field = key if field is None else field
                _check_text(key, key_where, key_field)
                pending.append((item, key_where, key_field, depth + 1))
        else:
            pending.extend(
                (item, f"{where}[{index}]", field, depth + 1)
                for index, item in enumerate(value) if isinstance(item, (str, dict, list)))


def _check_text(text: str, where: str, field: str | None) -> None:
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ApiError(
            400, f"{where or 'the request body'}: character {exc.start} is a lone UTF-16 surrogate, not valid UTF-8",
            param=field) from None
