"""`pdserve plan`: measured profiles, a discrete-event model of xPyD serving, a P:D recommendation.

    measure.py    engine step times on this device    ──▶ profile.py  Profile (JSON)
    workload.py   rate, lengths, SLOs                      │
    simulate.py   gateways, P prefill + D decode servers ◀─┘ ─▶ summary.py  TTFT/TPOT percentiles, goodput
    recommend.py  every xPyD split of a GPU budget       ─▶ the split with the best SLO attainment
    report.py     markdown tables and plots; cli.py the `pdserve plan` steps

Traces come from pdserve.bench's own generators (bench.datasets, bench.arrivals), so a simulated
trace is the one `pdserve bench serve` sends with the same flags.
"""
