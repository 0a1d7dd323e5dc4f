"""What the gateway holds per replica (channels, decode sessions) is closed once the replica has
left the registry's listing and nothing uses it: not while a request's attempt uses it, nor while
a call made under `held` runs; a later request opens it again."""
import asyncio

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.gateway.disaggregated.replica_clients import Timeouts
from pdserve.gateway.disaggregated.replica_links import ReplicaLinks

D0, D1, P0 = ("d0", "127.0.0.1:1"), ("d1", "127.0.0.1:2"), ("p0", "127.0.0.1:3")


def with_links(test):
    async def go():
        links = ReplicaLinks(InternalAuth.open(), Timeouts())
        try:
            return await test(links)
        finally:
            await links.close()
    return asyncio.run(go())


def test_a_replica_listed_or_in_use_keeps_its_channel_and_session_and_one_gone_unused_loses_them():
    async def test(links):
        d0, d1 = links.decode(*D0), links.decode(*D1)
        links.prefill(*P0)
        await links.forget_gone(live={D0}, in_use={P0})
        kept = links.endpoints, links.decode(*D0) is d0
        await links.forget_gone(live={D0}, in_use=set())
        return kept, links.endpoints, links.decode(*D1) is d1, links.endpoints

    (kept_endpoints, same_d0), after_p0_ended, same_d1, reopened = with_links(test)
    assert kept_endpoints == {D0[1], P0[1]} and same_d0  # d1 left the listing and no request uses it
    assert after_p0_ended == {D0[1]}
    assert not same_d1 and reopened == {D0[1], D1[1]}  # a later request to d1 opens a fresh session


def test_a_call_under_held_keeps_its_replica_open_until_it_ends():
    async def test(links):
        d0 = links.decode(*D0)
        with links.held(*D0):
            await links.forget_gone(live=set(), in_use=set())
            during = links.endpoints, links.decode(*D0) is d0
        await links.forget_gone(live=set(), in_use=set())
        return during, links.endpoints

    (during_endpoints, same_d0), after = with_links(test)
    assert during_endpoints == {D0[1]} and same_d0
    assert after == set()
