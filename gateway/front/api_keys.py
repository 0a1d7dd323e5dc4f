"""API keys at the gateway's public fronts: each key is one caller, known by its fingerprint.

A caller presents `Authorization: Bearer KEY` (an HTTP header, or gRPC metadata
`authorization`). The gateway keeps only the SHA-256 digest of each key and compares digests
with `hmac.compare_digest` against every configured key, so the time an answer takes shows
neither a key nor how much of one matched. A caller's fingerprint, stored as the owner of the
requests it creates, is a prefix of that digest's hex: never the key. With no key configured
every call is served and every caller is the same anonymous one (fingerprint "").
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

import grpc

from pdserve.protocol.errors import InvalidConfigError, PdserveError

ENV_VAR = "PDSERVE_API_KEY"
"""Keys from the environment, comma-separated, beside those given as --api-key."""

ANONYMOUS = ""
"""The fingerprint of every caller when no key is configured."""

_FINGERPRINT_CHARS = 32  # 128 bits of the digest: unique per key, and no use for finding one
_BEARER = "bearer "


class UnauthenticatedError(PdserveError):
    """No key, or not a configured one: HTTP 401 / gRPC UNAUTHENTICATED."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class ApiKeys:
    def __init__(self, keys: Iterable[str]):
        keys = list(keys)
        if any(not key or key != key.strip() or "," in key for key in keys):
            raise InvalidConfigError("an API key must be non-empty, without spaces at its ends or commas")
        self._digests = [_digest(key) for key in dict.fromkeys(keys)]

    @property
    def required(self) -> bool:
        return bool(self._digests)

    def caller(self, authorization: str | None) -> str:
        """The fingerprint of the caller that sent this Authorization value; raises
        UnauthenticatedError when keys are required and it names none of them."""
        if not self._digests:
            return ANONYMOUS
        if authorization is None or not authorization.lower().startswith(_BEARER):
            raise UnauthenticatedError("missing API key: send the header 'Authorization: Bearer <key>'")
        given = _digest(authorization[len(_BEARER):].strip())
        matched = False
        for digest in self._digests:  # every key, whatever matched: the time says nothing
            matched |= hmac.compare_digest(given, digest)
        if not matched:
            raise UnauthenticatedError("invalid API key")
        return given.hex()[:_FINGERPRINT_CHARS]


def api_keys_from(flag_keys: Iterable[str] | None, environ: Mapping[str, str]) -> ApiKeys:
    """The keys given as repeated --api-key, and those in the environment's PDSERVE_API_KEY."""
    from_env = [key.strip() for key in environ.get(ENV_VAR, "").split(",") if key.strip()]
    return ApiKeys([*(flag_keys or ()), *from_env])


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
