"""The gateway's line of prompts waiting for prefill (gateway.disaggregated.prefill_line): in
SLO order a late request never goes before one that can still meet its TTFT; fifo is arrival
order."""
import asyncio

from pdserve.gateway.disaggregated.prefill_line import PrefillLine


def order(line, now_s, s_per_token=1e-3):
    return [(w.arrival_s, w.num_tokens) for w in line.ordered(now_s, s_per_token)]


def test_late_requests_go_after_those_that_can_still_be_on_time():
    async def main():
        line = PrefillLine("slo", ttft_slo_s=2.0)
        line.join(400, arrival_s=0.0)  # at 2.5 s it is past its deadline
        line.join(400, arrival_s=0.8)  # 2.5 + 0.4 s > 2.8 s: late as well
        line.join(300, arrival_s=2.0)  # 2.5 + 0.3 <= 4.0: on time
        line.join(100, arrival_s=1.5)  # 2.5 + 0.1 <= 3.5: on time, earlier deadline
        return order(line, now_s=2.5)
    assert asyncio.run(main()) == [(1.5, 100), (2.0, 300), (0.0, 400), (0.8, 400)]


def test_fifo_is_arrival_order_and_leaving_takes_a_waiter_out():
    async def main():
        line = PrefillLine("fifo", ttft_slo_s=2.0)
        first = line.join(400, 0.0)
        line.join(100, 1.0)
        before = order(line, now_s=10.0)
        line.leave(first)
        line.leave(first)  # leaving twice is harmless
        return before, order(line, now_s=10.0), len(line)
    before, after, size = asyncio.run(main())
    assert before == [(0.0, 400), (1.0, 100)] and after == [(1.0, 100)] and size == 1
