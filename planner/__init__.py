"""`pdserve plan`: measured profiles, a discrete-event model of xPyD serving, a P:D recommendation.

    measure.py   engine step times on this device   ─┐
    serving.py   serving-path overheads (pdserve up) ─┴▶ profile.py  Profile (JSON)
    workload.py  rate, lengths, SLOs                     │
    simulate.py  P prefill + D decode servers, events  ◀─┘ ─▶ TTFT/TPOT percentiles, goodput
    recommend.py every xPyD split of a GPU budget      ─▶ the split with the most goodput
    validate.py  the same configurations through `pdserve bench`, side by side
"""
