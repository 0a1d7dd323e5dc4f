"""`pdserve plan`: measured profiles, a discrete-event model of xPyD serving, a P:D recommendation.

    measure.py    engine step times on this device    ─┐
    serving.py    serving-path overheads (pdserve up) ─┴▶ profile.py  Profile (JSON)
    workload.py   rate, lengths, SLOs                      │
    simulate.py   gateways, P prefill + D decode servers ◀─┘ ─▶ summary.py  TTFT/TPOT percentiles, goodput
    recommend.py  every xPyD split of a GPU budget       ─▶ the split with the best SLO attainment
    report.py     markdown tables and plots; cli.py the `pdserve plan` steps

The serving runs start `pdserve up` and send traces through pdserve.bench (bench.systems,
bench.runner): the planner has no launch code of its own.
"""
