"""`pdserve gateway`: a `Frontend` over a disaggregated deployment. frontend.py routes each request,
request.py drives it through its states on a prefill and a decode replica, and the rest are its
clients, router and Redis records."""
