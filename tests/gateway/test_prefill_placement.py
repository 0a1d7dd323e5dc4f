"""Where a prompt is prefilled (gateway.disaggregated.prefill_placement): remote while the
prefill side keeps up, local when the decode replica is expected to be sooner, otherwise wait;
and the cost per token the ledger learns from first tokens."""
from pdserve.gateway.disaggregated.prefill_placement import PrefillLedger, PrefillTicket, Where, place

COSTS = {Where.REMOTE: 1e-3, Where.LOCAL: 2e-3}


def test_an_idle_prefill_replica_always_takes_the_prompt():
    assert place("auto", 400, 0, remote_backlog=0, local_backlog=0, s_per_token=COSTS,
                 max_queue_s=1.0) is Where.REMOTE


def test_a_busy_prefill_side_sends_a_short_prompt_to_an_idle_decode_replica():
    # remote: (800 + 100) * 1 ms = 0.9 s; local: 100 * 2 ms = 0.2 s
    assert place("auto", 100, 0, 800, 0, COSTS, 1.0) is Where.LOCAL
    assert place("remote", 100, 0, 800, 0, COSTS, 1.0) is Where.REMOTE


def test_a_prefix_cached_on_decode_counts_for_local():
    # remote: (300 + 400) * 1 ms = 0.7 s; local without the hit: 400 * 2 ms = 0.8 s, with 320 cached 0.16 s
    assert place("auto", 400, 0, 300, 0, COSTS, 1.0) is Where.REMOTE
    assert place("auto", 400, 320, 300, 0, COSTS, 1.0) is Where.LOCAL


def test_when_both_sides_hold_their_share_of_queued_work_the_prompt_waits():
    # remote: (1200 + 400) * 1 ms = 1.6 s > 1 s; local: (600 + 400) * 2 ms = 2 s
    assert place("auto", 400, 0, 1200, 600, COSTS, 1.0) is None


def test_a_fixed_placement_uses_its_side_alone_and_still_bounds_its_queue():
    assert place("local", 400, 0, 0, 0, COSTS, 1.0) is Where.LOCAL  # even with the prefill replica idle
    assert place("local", 400, 0, 0, 600, COSTS, 1.0) is None  # (600 + 400) * 2 ms > 1 s
    assert place("remote", 400, 0, 1200, 0, COSTS, 1.0) is None


def test_the_ledger_learns_the_cost_of_a_token_from_first_tokens():
    now = [0.0]
    ledger = PrefillLedger(clock=lambda: now[0])
    first = ledger.send(Where.REMOTE, "p0", 300)
    second = ledger.send(Where.REMOTE, "p0", 200)
    assert ledger.backlog(Where.REMOTE, "p0") == 500 and second.num_ahead == 500
    now[0] = 1.0  # 500 tokens ahead of the second took 1 s: 2 ms a token
    before = ledger.s_per_token[Where.REMOTE]
    ledger.done(second, first_token=True)
    assert before < ledger.s_per_token[Where.REMOTE] < 2e-3
    ledger.done(first, first_token=False)  # an attempt that ended early teaches nothing
    assert ledger.backlog(Where.REMOTE, "p0") == 0


def test_a_ticket_is_taken_off_the_ledger_once():
    ledger, calls = PrefillLedger(), []
    ticket = PrefillTicket(ledger, ledger.send(Where.LOCAL, "d0", 100), lambda: calls.append(1))
    ticket.done(first_token=True)
    ticket.done(first_token=False)
    assert ledger.backlog(Where.LOCAL, "d0") == 0 and calls == [1]
