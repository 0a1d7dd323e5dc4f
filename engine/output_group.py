"""Outputs of several requests delivered together, the way vLLM's EngineCoreOutputs reach a client.

A group's queue holds one list per engine step that produced anything for its members (new
tokens, a finish), and one list per member that failed outside a step (`RequestFailure`).
Within the queue a member's entries come in order and end with a finished output or a failure,
unless it leaves the group first. An exception item instead of a list ends the group (the engine
died, or the group's owner closed it): nothing more comes for any member.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pdserve.protocol.outputs import RequestOutput


@dataclass(frozen=True, slots=True)
class RequestFailure:
    request_id: str
    error: Exception  # a typed domain error (engine.errors), mapped to a status at the edge


GroupEntry = RequestOutput | RequestFailure


class OutputGroup:
    def __init__(self):
        self.queue: asyncio.Queue[list[GroupEntry] | Exception] = asyncio.Queue()

    def put(self, entries: list[GroupEntry]) -> None:
        self.queue.put_nowait(entries)

    def fail(self, request_id: str, error: Exception) -> None:
        self.queue.put_nowait([RequestFailure(request_id, error)])

    def end(self, error: Exception) -> None:
        self.queue.put_nowait(error)
