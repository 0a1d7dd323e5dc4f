"""Partitions between hosts (tests/system/faults/netns.py: each process on a host of its own, two
of them cut apart) while the decode replica cut off still reaches Redis, so the registry goes on
listing it: from the gateway (keepalive finds the cut and the streams on it move to the other
decode replica), or from the prefill replica (the KV pushes to it fail and are blamed on it).
Either way no request fails, the tokens are those of an unharmed run, new requests keep off the
cut replica (outlier ejection), and once the link heals it serves again. Skipped where this
machine will not make namespaces."""
import asyncio
import secrets
import time

import pytest

from pdserve.redis_process import start_redis
from tests.system.conftest import Cluster
from tests.system.faults.conftest import StreamRun, greedy_request, request_info
from tests.system.faults.netns import NetnsUnavailableError, create_hosts
from tests.system.faults.test_decode_migration import prompts

pytestmark = pytest.mark.faults

REMOTE = ("--prefill-placement", "remote")  # every prompt through the prefill replica: both links in use
LAYOUT = [("prefill", "p0", ()), ("decode", "d0", ()), ("decode", "d1", ()), ("gateway", "gw", REMOTE)]
NUM_STREAMS = 8
NUM_TOKENS = 150
AVOID_WITHIN_S = 15.0  # new requests keep off the cut replica from this long after the cut
SERVE_AGAIN_WITHIN_S = 30.0  # after healing
NEW_EVERY_S = 1.0
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def hosts():
    try:
        made = create_hosts(["redis", "gw", "p0", "d0", "d1"])
    except NetnsUnavailableError as error:
        pytest.skip(f"needs network namespaces: {error}")
    yield made
    made.close()


@pytest.fixture(scope="module")
def cluster(hosts, e2e_model, tmp_path_factory):
    redis_server = start_redis(data_dir=tmp_path_factory.mktemp("redis"), password=secrets.token_hex(16),
                               host=hosts.address("redis"), launcher=hosts.launcher("redis"))
    started = Cluster(e2e_model, tmp_path_factory.mktemp("cluster"), redis_server.url, secrets.token_hex(32))
    try:
        for kind, name, flags in LAYOUT:
            started.start(kind, name, *flags, host=hosts.address(name), launcher=hosts.launcher(name))
        started.wait_ready()
        yield started
    finally:
        started.stop()
        redis_server.stop()


async def new_requests(cluster: Cluster, prefix: str, prompt: list[int], num: int) -> list[tuple[str, float, object]]:
    """`num` requests, one every NEW_EVERY_S: (request id, when sent, its error or None)."""
    async def one(i: int) -> tuple[str, float, object]:
        await asyncio.sleep(i * NEW_EVERY_S)
        sent_s = time.monotonic()
        [outcome] = await StreamRun(cluster.gateway.endpoint, [greedy_request(f"{prefix}-{i}", prompt, NEW_TOKENS)]).run()
        return f"{prefix}-{i}", sent_s, outcome.error
    return await asyncio.gather(*(one(i) for i in range(num)))


def serves_again(cluster: Cluster, replica: str, prompt: list[int], deadline_s: float, prefix: str) -> float:
    """Seconds until a request lands on `replica` again: rounds of four at once, so the router
    spreads them over both decode replicas; fails past `deadline_s`."""
    started_s = time.monotonic()
    for round_index in range(100):
        requests = [greedy_request(f"{prefix}-{round_index}-{i}", prompt, NEW_TOKENS) for i in range(4)]
        outcomes = asyncio.run(StreamRun(cluster.gateway.endpoint, requests).run())
        assert all(outcome.error is None for outcome in outcomes), [o.error for o in outcomes]
        if any(request_info(cluster, r.request_id).decode_replica == replica for r in requests):
            return time.monotonic() - started_s
        assert time.monotonic() < deadline_s, f"{replica} got no request {SERVE_AGAIN_WITHIN_S:g} s after healing"
        time.sleep(0.5)
    raise AssertionError("too many rounds")


@pytest.mark.timeout(420)
def test_a_decode_replica_cut_off_from_the_gateway_loses_no_stream_and_serves_again_once_healed(
        cluster, hosts, e2e_model):
    cases = prompts(e2e_model, NUM_STREAMS, seed=31)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"ref-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    assert all(outcome.error is None for outcome in reference)
    new_prompt = prompts(e2e_model, 1, seed=32)[0]
    newcomers: list = []

    async def cut_mid_stream(run: StreamRun):
        await run.wait_for(lambda outcomes: len(outcomes[0].token_ids) >= 10 and all(o.token_ids for o in outcomes),
                           "r-0 to reach 10 tokens and every stream to start")
        run.victim = (await asyncio.to_thread(request_info, cluster, "r-0")).decode_replica
        hosts.cut("gw", run.victim)
        run.killed_s = time.monotonic()
        newcomers.extend(await new_requests(cluster, "new", new_prompt, round(AVOID_WITHIN_S / NEW_EVERY_S) + 5))

    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"r-{i}", p, NUM_TOKENS) for i, p in enumerate(cases)])
    try:
        outcomes = asyncio.run(run.run(cut_mid_stream))
    finally:
        if run.victim is not None:
            hosts.heal("gw", run.victim)
    healed_s = time.monotonic()

    errors = [(i, o.error.code(), o.error.details()) for i, o in enumerate(outcomes) if o.error is not None]
    assert errors == []
    assert [o.token_ids for o in outcomes] == [want.token_ids for want in reference]
    assert request_info(cluster, "r-0").decode_replica != run.victim
    new_errors = [str(error) for _, _, error in newcomers if error is not None]
    assert not any("no live prefill replica" in error for error in new_errors)
    late = [request_id for request_id, sent_s, _ in newcomers if sent_s - run.killed_s >= AVOID_WITHIN_S]
    assert late and all(request_info(cluster, request_id).decode_replica != run.victim for request_id in late)
    assert new_errors == []

    back_s = serves_again(cluster, run.victim, new_prompt, healed_s + SERVE_AGAIN_WITHIN_S, "heal")
    print(f"\ngateway-decode cut: {NUM_STREAMS} streams moved off {run.victim} with no error; "
          f"{len(newcomers)} new requests meanwhile, none failed; it served again {back_s:.1f}s after healing")
    cluster.assert_all_kv_free(timeout_s=30.0)


@pytest.mark.timeout(420)
def test_a_decode_replica_cut_off_from_the_prefill_replica_loses_no_request_and_serves_again_once_healed(
        cluster, hosts, e2e_model):
    """The KV pushes to the cut replica fail: they are blamed on it, not on the prefill replica (the
    only one), so the requests move to the other decode replica and none reads "no live prefill
    replica"; the streams already decoding on it, which need no push, go on there."""
    cases = prompts(e2e_model, NUM_STREAMS, seed=33)
    reference = asyncio.run(StreamRun(cluster.gateway.endpoint, [
        greedy_request(f"pref-{i}", prompt, NUM_TOKENS) for i, prompt in enumerate(cases)]).run())
    assert all(outcome.error is None for outcome in reference)
    new_prompt = prompts(e2e_model, 1, seed=34)[0]
    newcomers: list = []

    async def cut_mid_stream(run: StreamRun):
        await run.wait_for(lambda outcomes: len(outcomes[0].token_ids) >= 10 and all(o.token_ids for o in outcomes),
                           "p-0 to reach 10 tokens and every stream to start")
        run.victim = (await asyncio.to_thread(request_info, cluster, "p-0")).decode_replica
        hosts.cut("p0", run.victim)
        run.killed_s = time.monotonic()
        newcomers.extend(await new_requests(cluster, "pnew", new_prompt, round(AVOID_WITHIN_S / NEW_EVERY_S) + 5))

    run = StreamRun(cluster.gateway.endpoint, [greedy_request(f"p-{i}", p, NUM_TOKENS) for i, p in enumerate(cases)])
    try:
        outcomes = asyncio.run(run.run(cut_mid_stream))
    finally:
        if run.victim is not None:
            hosts.heal("p0", run.victim)
    healed_s = time.monotonic()

    errors = [(i, o.error.code(), o.error.details()) for i, o in enumerate(outcomes) if o.error is not None]
    assert errors == []
    assert [o.token_ids for o in outcomes] == [want.token_ids for want in reference]
    new_errors = [str(error) for _, _, error in newcomers if error is not None]
    assert new_errors == []
    late = [request_id for request_id, sent_s, _ in newcomers if sent_s - run.killed_s >= AVOID_WITHIN_S]
    assert late and all(request_info(cluster, request_id).decode_replica != run.victim for request_id in late)

    back_s = serves_again(cluster, run.victim, new_prompt, healed_s + SERVE_AGAIN_WITHIN_S, "pheal")
    print(f"\nprefill-decode cut: {NUM_STREAMS} streams, none failed; {len(newcomers)} new requests meanwhile, "
          f"none failed; {run.victim} served again {back_s:.1f}s after healing")
    cluster.assert_all_kv_free(timeout_s=30.0)
