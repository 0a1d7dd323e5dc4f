"""A summary of what the server recorded per request (the gRPC backend's `GetRequest` answers):
final states and transports counted, KV bytes and transfer time totalled and averaged."""
from __future__ import annotations

from collections import Counter


def summarise_request_details(details: list[dict]) -> dict | None:
    known = [detail for detail in details if "state" in detail]
    if not known:
        return None
    total_bytes = sum(detail["kv_bytes"] for detail in known)
    total_s = sum(detail["kv_transfer_s"] for detail in known)
    return {
        "num_described": len(known),
        "states": dict(Counter(detail["state"] for detail in known)),
        "transports": dict(Counter(detail["transport"] for detail in known)),
        "kv_bytes_total": total_bytes,
        "kv_bytes_per_request": total_bytes / len(known),
        "kv_transfer_s_mean": total_s / len(known),
        "kv_transfer_gb_per_s": total_bytes / total_s / 1e9 if total_s > 0 else None,
    }
