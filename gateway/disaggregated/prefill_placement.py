"""Where a prompt is prefilled: on a prefill replica (remote, the default) or on the decode
replica that will generate it (local: conditional disaggregation), or not yet.

The gateway keeps a ledger of the prompts it sent to each replica and whose first token has not
come back, in tokens to compute (its backlog there), and learns from each first token what one
such token costs on each side: seconds from dispatch to first token over the tokens that were
ahead of it, its own included (an exponential moving average per side). A prompt's expected wait
on a side is then (backlog + its tokens) * cost. The rule (`auto`), for a prompt of
`num_tokens` with `num_cached` of them already in the decode replica's prefix cache:

    remote   if the prefill replica has no backlog: the prefill side keeps up
    local    if allowed, the decode replica's local backlog stays within `max_queue_s`, and its
             wait is shorter than the remote one (a short prompt, a long prefill queue, or a
             prefix the decode replica already holds all make it so)
    remote   if its wait stays within `max_queue_s`
    none     otherwise: the prompt waits in the gateway's line (gateway.disaggregated.prefill_line)

`remote` and `local` instead place every prompt on that side, whenever its backlog there is empty
or within `max_queue_s`.

A local prefill runs in chunks between the decode replica's steps, each step held to its
`--max-step-ms` (engine.step_budget), so the streams it serves keep their inter-token latency:
its cost per token is higher than remote, and the learned costs say by how much.
"""
from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

PLACEMENTS = ("auto", "remote", "local")
SMOOTHING = 0.2  # weight of the newest first token in a side's cost
INITIAL_S_PER_TOKEN = {"remote": 1e-3, "local": 2e-3}  # until a first token comes back from that side


class Where(enum.Enum):
    REMOTE = "remote"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A prompt sent to `replica_id` on side `where`, until its first token comes back."""

    where: Where
    replica_id: str
    num_tokens: int  # tokens it computes there
    num_ahead: int  # tokens the replica had to compute before it sent, its own included
    sent_s: float


class PrefillLedger:
    """This gateway's prompts in flight per replica and the learned cost of a token per side."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._backlog: dict[tuple[Where, str], int] = {}
        self.s_per_token = {where: INITIAL_S_PER_TOKEN[where.value] for where in Where}

    def backlog(self, where: Where, replica_id: str) -> int:
        return self._backlog.get((where, replica_id), 0)

    def send(self, where: Where, replica_id: str, num_tokens: int) -> Dispatch:
        key = (where, replica_id)
        self._backlog[key] = self._backlog.get(key, 0) + num_tokens
        return Dispatch(where, replica_id, num_tokens, self._backlog[key], self._clock())

    def done(self, dispatch: Dispatch, first_token: bool) -> None:
        """Takes the dispatch off its replica's backlog; a `first_token` that came back teaches the cost."""
        key = (dispatch.where, dispatch.replica_id)
        self._backlog[key] -= dispatch.num_tokens
        if not self._backlog[key]:
            del self._backlog[key]
        if first_token and dispatch.num_ahead > 0:
            sample = (self._clock() - dispatch.sent_s) / dispatch.num_ahead
            average = self.s_per_token[dispatch.where]
            self.s_per_token[dispatch.where] = (1 - SMOOTHING) * average + SMOOTHING * sample


def place(placement: str, num_tokens: int, num_cached: int, remote_backlog: int, local_backlog: int,
          s_per_token: dict[Where, float], max_queue_s: float) -> Where | None:
    """The side to prefill on now under `placement` (one of PLACEMENTS), or None to wait (the
    module docstring's rule)."""
    remote_s = (remote_backlog + num_tokens) * s_per_token[Where.REMOTE]
    local_s = (local_backlog + num_tokens - num_cached) * s_per_token[Where.LOCAL]
    remote_open = remote_backlog == 0 or remote_s <= max_queue_s
    local_open = local_backlog == 0 or local_s <= max_queue_s
    if placement == "remote":
        return Where.REMOTE if remote_open else None
    if placement == "local":
        return Where.LOCAL if local_open else None
    if remote_backlog == 0:
        return Where.REMOTE
    if local_open and local_s < remote_s:
        return Where.LOCAL
    return Where.REMOTE if remote_open else None


class PrefillTicket:
    """A placed prompt's entry in the ledger, until its first token comes back or its attempt
    ends, whichever is first: `done` takes it off once and calls `on_done` (the dispatcher may
    place more)."""

    def __init__(self, ledger: PrefillLedger, dispatch: Dispatch, on_done: Callable[[], None]):
        self.where = dispatch.where
        self._ledger = ledger
        self._dispatch = dispatch
        self._on_done = on_done
        self._done = False

    def done(self, first_token: bool) -> None:
        if self._done:
            return
        self._done = True
        self._ledger.done(self._dispatch, first_token)
        self._on_done()
