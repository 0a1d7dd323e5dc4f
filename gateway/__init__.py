"""The gateway: what clients talk to, in three parts.

    front/           the public fronts over the `Frontend` contract (front/frontend.py): OpenAI
                     HTTP, the gRPC `pdserve.v1.Gateway` service, request shaping, admission,
                     API keys, tokenization, metrics
    disaggregated/   `pdserve gateway`: a `Frontend` that drives each request through a prefill
                     and a decode replica found in Redis (routing, the request's lifecycle,
                     migration, the request store)
    colocated/       `pdserve serve`: the same fronts over one in-process engine

front/ and disaggregated/ never import torch (tests/architecture/test_layering.py); colocated/
is a package of its own above them, the one part that runs an engine.
"""
