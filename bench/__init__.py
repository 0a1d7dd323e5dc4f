"""`pdserve bench`: a serving benchmark client shaped like `vllm bench serve`, and micro-benchmarks.

Layout: `datasets` builds the trace, `client` (the OpenAI completions API) or `backend_grpc` (the
gateway's gRPC API) yields stream pieces, `records` times one stream into a `RequestRecord`,
`metrics` aggregates records into vLLM's figures, `server_metrics` scrapes the server's Prometheus
endpoint, `runner` ties them into `run_benchmark`; `systems` starts what is measured; `report*`
present the results. The micro-benchmarks, each on the CPU or a GPU (`--device`):
`profile_decode_step`, `decode_kernel`, `kv_transfer`, timed by `bandwidth`. `cli` is
`pdserve bench WORKLOAD`.
"""
