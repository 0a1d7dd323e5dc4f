"""The public fronts (OpenAI HTTP, gRPC) and what they share, over the `Frontend` contract
(frontend.py): whatever serves requests behind it, disaggregated or colocated, the fronts answer
the same requests with the same bodies, statuses and metrics."""
