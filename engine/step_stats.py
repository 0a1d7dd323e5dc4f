"""What an engine's steps have done since it started, by kind of step (protocol/step_kinds.py):
how many ran, the seconds they took (the model runner's: forward and sampling) and the tokens they
computed. Where the seconds of a busy replica go (say, mixed steps taking half its time for a
tenth of its tokens) is what these figures show; `/metrics` publishes them per replica.

Invariant: every step that runs a chunk is counted once, under one kind, and every figure only grows.
"""
from __future__ import annotations

from pdserve.protocol.step_kinds import STEP_KINDS, step_kind


class StepStats:
    def __init__(self):
        self.num_steps = dict.fromkeys(STEP_KINDS, 0)
        self.busy_s = dict.fromkeys(STEP_KINDS, 0.0)
        self.num_prompt_tokens = 0  # computed in prompt chunks, recomputed ones included
        self.num_decode_tokens = 0

    def observe(self, num_decodes: int, num_prompt_tokens: int, seconds: float) -> None:
        """One step of the engine: its chunks' tokens and how long it took."""
        kind = step_kind(num_decodes, num_prompt_tokens)
        if kind is None:
            return
        self.num_steps[kind] += 1
        self.busy_s[kind] += seconds
        self.num_prompt_tokens += num_prompt_tokens
        self.num_decode_tokens += num_decodes

    def figures(self) -> dict[str, int | float]:
        """The figures as `LLMEngine.load()` reports them (cluster.registry_entry.ReplicaInfo's names)."""
        return {**{f"{kind}_steps": self.num_steps[kind] for kind in STEP_KINDS},
                **{f"{kind}_steps_s": self.busy_s[kind] for kind in STEP_KINDS},
                "computed_prompt_tokens": self.num_prompt_tokens, "computed_decode_tokens": self.num_decode_tokens}
