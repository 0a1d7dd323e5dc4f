"""pdserve: LLM serving with prefill/decode disaggregation.

This folder's own modules are the command line and the local supervisor (`pdserve up`). Every
other subpackage (engine, gateway, prefill_svc, decode_svc, kvtransfer, cluster, checkpoints,
kernels, protocol, bench, planner) is a folder at the top of the repository, linked here by a
relative symbolic link, so `pdserve.engine` is pdserve/engine on disk for every tool that reads it;
`pdserve.v1` links to protos/pdserve/v1.
"""
