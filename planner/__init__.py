"""`pdserve plan`: measured profiles, a discrete-event model of xPyD serving, a P:D recommendation.

    measure.py    engine step times on this device    ─┐
    serving.py    serving-path overheads (pdserve up) ─┴▶ profile.py  Profile (JSON)
    pool.py       profiles made apart in time ─▶ one       │
    proc_cpu.py   CPU seconds from /proc, by part          │  jitter.py       measured spreads, seeded draws
    workload.py   rate, lengths, SLOs                      │  cpu_sharing.py  work beside the engines, per event
    simulate.py   gateways, P prefill + D decode servers ◀─┘ ─▶ TTFT/TPOT percentiles, goodput
                  shared_cpus.py  a CPU host's cores, shared fairly by pinned and floating jobs
    recommend.py  every xPyD split of a GPU budget       ─▶ the split with the best SLO attainment
    validate.py   the same configurations through `pdserve bench` (bench_runs.py), side by side
    report.py     markdown tables and the fleet plot; cli.py the `pdserve plan` steps
"""
