"""The vocabulary every process of a deployment shares, and nothing heavier.

What a request asks (`SamplingParams`, the checks every request passes on arrival), what it
returns (`RequestOutput`), how it fails (the typed errors every edge maps), how its text is made
(tokenizer, incremental detokenizer, stop strings), how its KV blocks are counted and named, which
transport moves them, and the limits a model folder sets. The gateway, the replicas, the engine
and the benchmarks all speak it.

Invariant: no module here imports torch, triton, cupy or grpc (tests/architecture/test_layering.py),
so whatever imports only this package and the others it declares torch-free can never load torch.
"""
