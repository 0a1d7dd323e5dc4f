"""The line of requests waiting in the gateway for their prefill to start, and its order.

A request waits here, not in a replica's queue, until its prefill can be placed
(gateway.disaggregated.prefill_placement), so the replicas' own queues stay short and the order in
which prompts start is decided here, where every waiting request is seen:

    slo    those that can still meet their time-to-first-token target first, earliest deadline
           first; then those that cannot any more (their wait plus the expected time of their
           own prefill is past the target), oldest first: a late request never delays one that
           can still be on time
    fifo   arrival order

A waiter is handed its turn (its future resolved) by the frontend's dispatcher, which walks
`ordered()` and stops at the first waiter it cannot place, so none overtakes another ahead of it
in the order. The line refuses nothing: the gateway's admission bound (gateway.front.admission)
bounds it, and a waiter leaves it when its turn comes or its request goes away.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

ORDERS = ("slo", "fifo")


@dataclass(eq=False, slots=True)
class Waiter:
    num_tokens: int  # prompt tokens to compute
    arrival_s: float  # when its request arrived (a retried request keeps its place)
    deadline_s: float  # arrival plus the time-to-first-token target
    turn: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class PrefillLine:
    def __init__(self, order: str, ttft_slo_s: float):
        if order not in ORDERS:
            raise ValueError(f"order {order!r} is not one of {ORDERS}")
        self.order = order
        self.ttft_slo_s = ttft_slo_s
        self._waiters: list[Waiter] = []

    def __len__(self) -> int:
        return len(self._waiters)

    def join(self, num_tokens: int, arrival_s: float) -> Waiter:
        waiter = Waiter(num_tokens, arrival_s, arrival_s + self.ttft_slo_s)
        self._waiters.append(waiter)
        return waiter

    def leave(self, waiter: Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def ordered(self, now_s: float, s_per_token: float) -> list[Waiter]:
        """The waiters in the order their turns come; `s_per_token` estimates each one's prefill."""
        if self.order == "fifo":
            return sorted(self._waiters, key=lambda w: w.arrival_s)

        def key(waiter: Waiter) -> tuple[bool, float]:
            late = now_s + waiter.num_tokens * s_per_token > waiter.deadline_s
            return (late, waiter.arrival_s if late else waiter.deadline_s)
        return sorted(self._waiters, key=key)
