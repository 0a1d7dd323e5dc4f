"""Registry entries signed with the deployment secret, so that whoever can write to Redis cannot
list a replica of their own: a gateway sends prompts only to replicas whose entry verifies.

    entry = canonical JSON of the ReplicaInfo's fields + "signature": hex HMAC-SHA256(secret,
            canonical JSON)     canonical: keys sorted, no spaces, the "signature" key left out

With no secret (an open deployment) entries carry no signature and every entry is taken as it is.
"""
from __future__ import annotations

import hashlib
import hmac
import json

SIGNATURE_FIELD = "signature"


def canonical_json(fields: dict) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def signature(fields: dict, key: bytes) -> str:
    return hmac.new(key, canonical_json(fields), hashlib.sha256).hexdigest()


def sign_entry(fields: dict, key: bytes | None) -> str:
    """The JSON stored for `fields`: signed with `key`, or plain without one."""
    if key is None:
        return json.dumps(fields)
    return json.dumps({**fields, SIGNATURE_FIELD: signature(fields, key)})


def verified_fields(value: str, key: bytes | None) -> dict | None:
    """The fields of a stored entry; None if `key` is set and the entry's signature does not
    match it (missing, malformed or forged)."""
    try:
        fields = json.loads(value)
    except ValueError:
        return None
    if not isinstance(fields, dict):
        return None
    presented = fields.pop(SIGNATURE_FIELD, None)
    if key is None:
        return fields
    if not isinstance(presented, str) or not hmac.compare_digest(presented, signature(fields, key)):
        return None
    return fields
