"""Where each pdserve engine's time went during a run: its steps' busy seconds, step counts and
computed tokens by kind of step (engine/step_stats.py), from the change over the run of the
gauges `/metrics` publishes per replica (bench/server_metrics.py's `gauge_changes`).

An engine is named by its replica's id ("prefill-0", "decode-0" in `pdserve up`), or "engine" for
`pdserve serve`'s one, whose gauges name no replica. A server that publishes none of these (vLLM,
llama.cpp) has no engines here. A replica's figures are as it last reported them (twice a second).
"""
from __future__ import annotations

import re

from pdserve.protocol.step_kinds import STEP_KINDS

_SERIES = re.compile(r'pdserve:(replica_engine_steps|replica_engine_step_seconds|replica_computed_tokens)\{(.*)\}')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def engine_time(server: dict | None) -> dict[str, dict]:
    """{engine: {"busy_s": {kind: s}, "steps": {kind: n}, "prompt_tokens": n, "decode_tokens": n}}
    over the run of `server` (a result's server section); {} when it has none."""
    engines: dict[str, dict] = {}
    for key, change in ((server or {}).get("gauge_changes") or {}).items():
        if (match := _SERIES.fullmatch(key)) is None:
            continue
        name, labels = match.group(1), dict(_LABEL.findall(match.group(2)))
        engine = engines.setdefault(
            labels["replica"] or labels["kind"],
            {"busy_s": dict.fromkeys(STEP_KINDS, 0.0), "steps": dict.fromkeys(STEP_KINDS, 0),
             "prompt_tokens": 0, "decode_tokens": 0})
        if name == "replica_computed_tokens":
            engine[f"{labels['phase']}_tokens"] = round(change)
        elif name == "replica_engine_steps":
            engine["steps"][labels["step"]] = round(change)
        else:
            engine["busy_s"][labels["step"]] = change
    return dict(sorted(engines.items()))


def busy_text(engines: dict[str, dict], duration_s: float) -> str:
    """Each engine's share of `duration_s` in steps, then by kind: "decode-0 92% (decode 40,
    mixed 52)"; kinds it never ran are left out."""
    parts = []
    for name, engine in engines.items():
        shares = {kind: seconds / duration_s for kind, seconds in engine["busy_s"].items() if seconds > 0}
        by_kind = ", ".join(f"{kind} {100 * share:.0f}" for kind, share in shares.items())
        parts.append(f"{name} {sum(shares.values()):.0%}" + (f" ({by_kind})" if by_kind else ""))
    return "; ".join(parts)
