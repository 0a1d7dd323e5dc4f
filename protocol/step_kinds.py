"""The kinds of engine step a replica reports its time by (engine/step_stats.py), and what
makes a step one kind or another.

A step is "decode" when it runs single-token chunks only (running sequences, one token each, or a
prompt's last token alone), "prompt" when it runs longer chunks only, and "mixed" when it runs both
(prompt chunks riding with decodes: a colocated engine's steps under load, a decode replica's local
prefills).
"""
from __future__ import annotations

STEP_KINDS = ("decode", "mixed", "prompt")


def step_kind(num_decodes: int, num_prompt_tokens: int) -> str | None:
    """The kind of a step of `num_decodes` single-token chunks and `num_prompt_tokens` tokens in
    longer chunks; None for a step that ran nothing."""
    if num_prompt_tokens:
        return "mixed" if num_decodes else "prompt"
    return "decode" if num_decodes else None
