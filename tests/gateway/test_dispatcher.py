"""The gateway's dispatcher over an in-memory registry: turns come in the line's order, a head that
cannot be placed yet holds back those behind it, a request's end lets the next one go, and a prompt
no decode pool could hold, or one with no pair of replicas whose KV layouts match, fails at once."""
import asyncio
import dataclasses
import time

import pytest

from pdserve.cluster.registry import ReplicaInfo
from pdserve.gateway.disaggregated.backend_errors import BackendError
from pdserve.gateway.disaggregated.dispatcher import DispatchConfig, Dispatcher
from pdserve.gateway.disaggregated.outliers import Outliers
from pdserve.gateway.disaggregated.prefill_placement import Where
from pdserve.gateway.disaggregated.prefix_affinity import PrefixAffinity
from pdserve.gateway.disaggregated.router import Router
from pdserve.gateway.front.frontend_types import UnavailableError
from pdserve.gateway.front.metrics import GatewayMetrics

WAIT_S = 5.0


class Registry:
    """What LiveReplicas.list answers: one prefill and one decode replica of `free_blocks`."""

    def __init__(self, free_blocks: int, total_blocks: int = 64):
        self.decode = ReplicaInfo("d0", "decode", "127.0.0.1:1", "h", "cpu", free_blocks=free_blocks,
                                  total_blocks=total_blocks, block_size=16, updated_unix_s=time.time())
        self.prefill = ReplicaInfo("p0", "prefill", "127.0.0.1:2", "h", "cpu", updated_unix_s=time.time())

    async def list(self, kind: str) -> list[ReplicaInfo]:
        return [self.decode if kind == "decode" else self.prefill]


def dispatcher(registry: Registry, placement: str = "remote") -> Dispatcher:
    return Dispatcher(DispatchConfig(prefill_placement=placement), registry, PrefixAffinity(None), Router(),
                      GatewayMetrics("m"))


def test_turns_follow_the_line_and_a_blocked_head_holds_back_the_rest():
    async def main():
        registry = Registry(free_blocks=20)  # room for one 300-token prompt (19 blocks) at a time
        gateway = dispatcher(registry)
        now = time.monotonic()
        turns = [asyncio.create_task(gateway.turn(list(range(300)), set(), now + i, WAIT_S)) for i in range(3)]
        first = await asyncio.wait_for(turns[0], WAIT_S)
        await asyncio.sleep(0.2)  # the other two wait: the dispatch counts against the decode's blocks
        waiting = [not turn.done() for turn in turns[1:]]
        first.ticket.done(first_token=True)
        registry.decode = dataclasses.replace(registry.decode, updated_unix_s=time.time())  # a report after the first
        gateway.request_ended()
        second = await asyncio.wait_for(turns[1], WAIT_S)
        gateway.close()
        turns[2].cancel()
        return first, second, waiting, gateway.ledger.backlog(Where.REMOTE, "p0")
    first, second, waiting, backlog = asyncio.run(main())
    assert (first.decode.replica_id, first.prefill.replica_id) == ("d0", "p0")
    assert waiting == [True, True] and second.prefill is not None
    assert backlog == 300  # the second's, until its first token


def test_a_prompt_no_decode_pool_could_hold_fails_at_once():
    async def main():
        gateway = dispatcher(Registry(free_blocks=4, total_blocks=4))
        try:
            with pytest.raises(BackendError, match="KV blocks"):
                await asyncio.wait_for(gateway.turn(list(range(300)), set(), time.monotonic(), WAIT_S), WAIT_S)
        finally:
            gateway.close()
    asyncio.run(main())


def test_a_local_placement_names_no_prefill_replica():
    async def main():
        gateway = dispatcher(Registry(free_blocks=64), placement="local")
        try:
            return await asyncio.wait_for(gateway.turn(list(range(100)), set(), time.monotonic(), WAIT_S), WAIT_S)
        finally:
            gateway.close()
    placement = asyncio.run(main())
    assert placement.prefill is None and placement.ticket.where is Where.LOCAL


def test_an_ejected_decode_replica_gets_no_turn_while_another_can_take_it():
    async def main():
        registry = Registry(free_blocks=64)
        other = dataclasses.replace(registry.decode, replica_id="d1", free_blocks=32)  # fewer free: picked second
        registry.list = lambda kind: _listed([registry.decode, other] if kind == "decode" else [registry.prefill])
        outliers = Outliers()
        outliers.failed(("d0", registry.decode.endpoint))
        gateway = Dispatcher(DispatchConfig(prefill_placement="remote"), registry, PrefixAffinity(None), Router(),
                             GatewayMetrics("m"), outliers)
        try:
            return await asyncio.wait_for(gateway.turn(list(range(100)), set(), time.monotonic(), WAIT_S), WAIT_S)
        finally:
            gateway.close()
    assert asyncio.run(main()).decode.replica_id == "d1"


async def _listed(replicas: list[ReplicaInfo]) -> list[ReplicaInfo]:
    return replicas


def test_a_request_with_no_pair_of_matching_kv_layouts_fails_at_once():
    async def main():
        registry = Registry(free_blocks=64)
        registry.decode = dataclasses.replace(registry.decode, kv_layout_fingerprint="block-size-32")
        registry.prefill = dataclasses.replace(registry.prefill, kv_layout_fingerprint="block-size-16")
        gateway = dispatcher(registry)
        started_s = time.monotonic()
        try:
            with pytest.raises(UnavailableError, match="no live prefill replica shares a KV layout"):
                await asyncio.wait_for(gateway.turn(list(range(100)), set(), started_s, WAIT_S), WAIT_S)
        finally:
            gateway.close()
        return time.monotonic() - started_s
    assert asyncio.run(main()) < WAIT_S / 2  # refused, not left to wait out its deadline


def test_with_every_replica_of_a_kind_excluded_the_attempt_fails_naming_them():
    async def main():
        gateway = dispatcher(Registry(free_blocks=64))
        try:
            with pytest.raises(UnavailableError) as failure:
                await asyncio.wait_for(gateway.turn(list(range(100)), {"d0"}, time.monotonic(), WAIT_S), WAIT_S)
            return failure.value
        finally:
            gateway.close()
    assert str(asyncio.run(main())) == "no decode replica left for this request: it failed on d0"
