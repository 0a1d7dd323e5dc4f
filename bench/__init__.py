"""`pdserve bench`: a serving benchmark client shaped like `vllm bench serve`.

Layout: `datasets` builds the requests, `arrivals` decides when each is sent, `backends` speak
to a server (pdserve's gRPC gateway or any OpenAI-compatible HTTP server) and yield stream
pieces, `timing` turns one stream into a `RequestRecord`, `metrics` aggregates records into
vLLM's figures, `server_metrics` scrapes the server's Prometheus endpoint, `runner` ties them
into `run_benchmark`, and `report`, `plots`, `sweep` and `cli` present the result.
"""
