"""What every process of a deployment shares: the Redis client, the replica registry and its
heartbeats, the gRPC server lifecycle, the error-to-status mapping, proto <-> domain conversion
and the common service flags. It sits above kvtransfer and engine and below the services
(gateway, prefill_svc, decode_svc), and imports none of them."""
