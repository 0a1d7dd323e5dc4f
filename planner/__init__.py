"""`pdserve plan`: measured profiles, a discrete-event model of xPyD serving, a P:D recommendation.

    measure.py    engine step times on this device     ──▶ profile.py  Profile (JSON)
    workload.py   rate and lengths                          │
    simulate.py   P prefill + D decode servers        ◀────┘ ─▶ bench.metrics' figures and goodput
    recommend.py  every xPyD split of a GPU budget    ─▶ the split with the best SLO attainment
    report.py     markdown tables and plots; cli.py the `pdserve plan` steps

It reuses bench: traces come from bench's generators (bench.datasets, bench.arrivals), so a
simulated trace is the one `pdserve bench serve` sends with the same flags; simulated requests
are bench's records, summed up by bench.metrics; the decode batch is set up as `pdserve bench
decode-step` sets it up.
"""
