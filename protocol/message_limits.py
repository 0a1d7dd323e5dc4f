"""The largest message a pdserve process takes in, whatever the wire: 64 MiB.

The gateway's public fronts take an HTTP body, or a gRPC message, of at most `--max-request-bytes`
(default MAX_MESSAGE_BYTES; one limit for both fronts). Every gRPC server and channel between
pdserve's own services takes at most MAX_MESSAGE_BYTES, which a KV chunk is sized to fit
(kvtransfer/grpc_stream.py). A prompt that fits a model's context is far smaller.
"""
MAX_MESSAGE_BYTES = 64 * 2**20
