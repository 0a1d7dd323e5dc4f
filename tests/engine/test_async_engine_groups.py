"""AsyncEngine over a scripted engine: a group gets one list per step with its members' outputs,
per-request streams keep getting one output at a time, and an abort reaches either kind."""
import asyncio

import pytest
import torch

from pdserve.engine.async_engine import AsyncEngine, EngineDeadError
from pdserve.protocol.errors import AbortedError
from pdserve.engine.output_group import OutputGroup, RequestFailure
from pdserve.protocol.outputs import CompletionOutput, RequestOutput

DEADLINE_S = 5.0


class ScriptedEngine:
    """Each step emits one token for every request added and not yet finished or aborted;
    a request finishes after `num_tokens`. `fail_on_step` makes a step raise."""
    device = torch.device("cpu")

    def __init__(self, num_tokens: int, fail_on_step: int | None = None):
        self.num_tokens = num_tokens
        self.fail_on_step = fail_on_step
        self.num_steps = 0
        self.emitted: dict[str, int] = {}

    def add(self, request_id: str) -> None:
        self.emitted[request_id] = 0

    def abort_request(self, request_id: str) -> bool:
        return self.emitted.pop(request_id, None) is not None

    def has_unfinished_requests(self) -> bool:
        return bool(self.emitted)

    def step(self) -> list[RequestOutput]:
        self.num_steps += 1
        if self.num_steps == self.fail_on_step:
            raise RuntimeError("scripted failure")
        outputs = []
        for request_id in list(self.emitted):
            self.emitted[request_id] += 1
            finished = self.emitted[request_id] == self.num_tokens
            outputs.append(RequestOutput(request_id, [1], [CompletionOutput(0, "", [7])], finished=finished,
                                         new_token_ids=[7]))
            if finished:
                del self.emitted[request_id]
        return outputs


async def get(queue: asyncio.Queue):
    return await asyncio.wait_for(queue.get(), DEADLINE_S)


async def started(engine: ScriptedEngine) -> AsyncEngine:
    async_engine = AsyncEngine(engine, asyncio.get_running_loop())
    async_engine.start()
    return async_engine


def test_a_group_gets_one_list_per_step_and_a_stream_one_output_per_step():
    async def go():
        engine = ScriptedEngine(num_tokens=3)
        async_engine = await started(engine)
        group = OutputGroup()
        for request_id in ("a", "b"):
            async_engine.join_group(request_id, group)
        alone = async_engine.open_stream("c")
        await async_engine.call(lambda e: [e.add(rid) for rid in ("a", "b", "c")])
        lists = [await get(group.queue) for _ in range(3)]
        singles = [await get(alone) for _ in range(3)]
        await async_engine.stop()
        return lists, singles

    lists, singles = asyncio.run(go())
    assert [sorted(output.request_id for output in entries) for entries in lists] == [["a", "b"]] * 3
    assert [all(output.finished for output in entries) for entries in lists] == [False, False, True]
    assert [(output.request_id, output.finished) for output in singles] == [("c", False), ("c", False), ("c", True)]


def test_an_abort_ends_a_group_member_with_a_failure_entry():
    async def go():
        engine = ScriptedEngine(num_tokens=10**6)
        async_engine = await started(engine)
        group = OutputGroup()
        async_engine.join_group("a", group)
        await async_engine.call(lambda e: e.add("a"))
        await get(group.queue)
        assert await async_engine.abort("a")
        entries = []
        while not any(isinstance(entry, RequestFailure) for entry in entries):
            entries = await get(group.queue)
        await async_engine.stop()
        return entries

    entries = asyncio.run(go())
    failure = next(entry for entry in entries if isinstance(entry, RequestFailure))
    assert failure.request_id == "a" and isinstance(failure.error, AbortedError)


def test_a_dead_engine_ends_every_group_and_fails_later_calls():
    async def go():
        engine = ScriptedEngine(num_tokens=10, fail_on_step=2)
        async_engine = await started(engine)
        group = OutputGroup()
        async_engine.join_group("a", group)
        await async_engine.call(lambda e: e.add("a"))
        items = [await get(group.queue), await get(group.queue)]
        with pytest.raises(EngineDeadError):
            await async_engine.call(lambda e: None)
        await async_engine.stop()
        return items

    first, second = asyncio.run(go())
    assert [output.request_id for output in first] == ["a"]
    assert isinstance(second, EngineDeadError)
