"""The interface every benchmark backend implements, and what it raises.

A backend only translates: it sends one `BenchRequest` and yields `StreamPiece`s as the server
streams; `bench.timing` owns the clock. The backends themselves import this module and nothing
else of their kind; `bench.backends` names them and picks one.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.records import StreamPiece


class BackendError(Exception):
    """The server refused or broke one request; the runner records it as that request's error."""


@dataclass(frozen=True, slots=True)
class SendOptions:
    """What every request of a run asks for besides its prompt and output length."""

    temperature: float
    ignore_eos: bool
    timeout_s: float


class Backend(Protocol):
    async def open(self) -> str:
        """Connects; returns the model id the run uses."""

    def stream(self, request: BenchRequest, request_id: str) -> AsyncIterator[StreamPiece]:
        """The pieces of one request, sent only when iteration starts."""

    async def describe(self, request_ids: list[str]) -> dict[str, dict]:
        """What the server recorded about these requests, by id ({} if it cannot say)."""

    async def close(self) -> None: ...
