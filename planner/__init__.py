"""`pdserve plan`: measured profiles, a discrete-event model of xPyD serving, a P:D recommendation.

    measure.py    engine step times on this device     ──▶ profile.py  Profile (JSON)
                                                            │
    simulate.py   a trace on P prefill + D decode     ◀────┘ ─▶ bench.metrics' figures and goodput
    recommend.py  every xPyD split of a GPU budget    ─▶ the split with the best SLO attainment
    report.py     markdown tables and plots; cli.py the `pdserve plan` steps

It reuses bench: a simulated trace is the one `pdserve bench serve` sends with the same flags,
its requests are bench's records summed up by bench.metrics, and the decode batch is measured as
`pdserve bench decode-step` sets it up.
"""
