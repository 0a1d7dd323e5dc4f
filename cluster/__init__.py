"""What every process of one deployment (the cluster: its gateways, prefill and decode replicas
and their Redis) shares:

    registry, registry_entry,       the replica registry and its heartbeats: live replicas in
    registry_signing,               Redis, their entries and the rules for reading one, signed
    prefix_digest, redis_client     entries, cached-prefix digests, bounded calls
    internal_auth                   the deployment secret every internal service asks callers for
    grpc_server, replica_server,    the server lifecycle: health, reflection, graceful drain,
    health_probe, ports,            readiness probes, a free port to start on, the loading and
    startup_log                     ready lines an engine-serving process logs as it starts
    grpc_errors                     the error-to-status mapping, at the service edge
    protocol                        proto <-> domain conversion
    service_args, routing_policies  the common service arguments

It sits above kvtransfer and engine and below the services (gateway, prefill_svc, decode_svc),
and imports none of them."""
