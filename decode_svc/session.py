"""One gateway's requests on a decode replica, their outputs grouped per engine step.

    generate ──▶ member ──(its last entry is read: finished or failed)──▶ gone
                   │
                   └──(abort command, or the session closes)──▶ aborted in the engine: gone

A generate command either joins a landed reservation (`generate`) or brings a prompt the replica
prefills itself (`prefill_here`: no reservation; its prompt is computed in chunks between decode
steps, and its first token comes in its outputs like the rest). A prompt that finds the engine's
waiting queue at its bound fails at once (cluster.waiting_bound: RESOURCE_EXHAUSTED).

A request is a member of the session from its generate command until its last entry is read,
an abort command, or the session's close; closing aborts every member, so their blocks come
back. A command that cannot be served fails its request only (a `RequestFailure` entry): the
session carries on. Commands queue engine work without waiting for it, in arrival order, so a
burst of generate commands joins the batch at one step boundary and an abort takes effect
before the next step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pdserve.cluster.waiting_bound import check_waiting_room
from pdserve.decode_svc.reservations import ReservationError, ReservationTable
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.output_group import GroupEntry, OutputGroup, RequestFailure
from pdserve.protocol.errors import PdserveError, UnavailableError
from pdserve.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pdserve.engine.llm_engine import LLMEngine


class SessionClosedError(PdserveError):
    """The session was closed by its gateway; its stream ends normally."""


class ReplicaStoppingError(UnavailableError):
    """The replica is shutting down under the session."""


class DecodeSession:
    def __init__(self, engine: AsyncEngine, reservations: ReservationTable, max_waiting_requests: int):
        self._engine = engine
        self._reservations = reservations
        self._max_waiting_requests = max_waiting_requests
        self._group = OutputGroup()
        self._request_ids: set[str] = set()
        self._closed = False

    @property
    def num_requests(self) -> int:
        """Members: requests whose last entry has not been read yet."""
        return len(self._request_ids)

    def generate(self, request_id: str, prompt_ids: list[int], output_ids: list[int], first_token_id: int,
                 params: SamplingParams, seed: int) -> None:
        """Joins a landed request to the batch after `first_token_id` (and, for a resumed request,
        the `output_ids` before it); it fails if its KV has not landed, or if its tokens are not
        those its blocks were reserved for."""
        if self._closed:  # nobody reads this session's outputs any more
            self.abort(request_id)
            return
        try:
            reservation = self._reservations.join(request_id)
        except ReservationError as exc:
            self.refuse(request_id, exc)
            return
        num_landed = len(prompt_ids) + len(output_ids)
        if num_landed != reservation.num_prompt_tokens:
            self._engine.submit(lambda engine: engine.release_kv(request_id))
            self.refuse(request_id, ReservationError(
                f"request {request_id}: KV of {num_landed} tokens, {reservation.num_prompt_tokens} reserved"))
            return
        self._join(request_id, lambda engine: engine.add_prefilled_request(
            request_id, prompt_ids, first_token_id, params, seed, output_ids))

    def prefill_here(self, request_id: str, prompt_ids: list[int], output_ids: list[int], params: SamplingParams,
                     seed: int) -> None:
        """Queues the request's prompt (and a resumed request's `output_ids`) to be prefilled here;
        its first token is the one after them."""
        if self._closed:
            return

        def add(engine: LLMEngine) -> None:
            check_waiting_room(len(engine.scheduler.waiting), self._max_waiting_requests)
            engine.add_request(request_id, prompt_ids, params, seed=seed, output_token_ids=output_ids)

        self._join(request_id, add)

    def _join(self, request_id: str, add) -> None:
        self._request_ids.add(request_id)
        self._engine.join_group(request_id, self._group)
        added = self._engine.call(add)
        added.add_done_callback(lambda future: self._on_added(request_id, future))

    def refuse(self, request_id: str, error: Exception) -> None:
        """Fails a request the session could not start."""
        self._request_ids.add(request_id)
        self._group.fail(request_id, error)

    def abort(self, request_id: str) -> None:
        """Ends the request (or releases its reservation, once no KV write holds it); nothing
        more comes for it."""
        releasable = self._reservations.remove(request_id)
        self._request_ids.discard(request_id)
        self._engine.close_stream(request_id)
        if releasable:
            self._engine.submit(lambda engine: engine.abort_request(request_id))

    async def next_step(self) -> list[GroupEntry]:
        """The entries of the next engine step (or refused command) that concern a member.
        Raises the error that ended the session: SessionClosedError, ReplicaStoppingError,
        EngineDeadError."""
        while True:
            item = await self._group.queue.get()
            if isinstance(item, Exception):
                raise item
            entries = [entry for entry in item if entry.request_id in self._request_ids]
            for entry in entries:
                if isinstance(entry, RequestFailure) or entry.finished:
                    self._request_ids.discard(entry.request_id)
                    self._engine.close_stream(entry.request_id)
            if entries:
                return entries

    def close(self, reason: Exception | None = None) -> None:
        """Aborts every member and ends `next_step` with `reason` (default: closed by the gateway)."""
        if self._closed:
            return
        self._closed = True
        for request_id in list(self._request_ids):
            self.abort(request_id)
        self._group.end(reason or SessionClosedError("the gateway closed the session"))

    def _on_added(self, request_id: str, future) -> None:
        if future.cancelled() or future.exception() is None or request_id not in self._request_ids:
            return
        self.abort(request_id)  # gives back the blocks that the refused request still holds
        self.refuse(request_id, future.exception())
