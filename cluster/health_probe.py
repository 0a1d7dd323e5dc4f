"""One-shot readiness probes: the standard gRPC health check and an HTTP GET.

Each probe answers "ready or not" within its own timeout and never raises for a server that is
down, still starting or unhealthy; it returns a `ProbeResult` whose `detail` says why not. An
internal service on mutual TLS is probed with the prober's own certificate
(cluster/internal_tls.py), and is not ready to a prober without one.
"""
from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.cluster.internal_tls import InternalTls

_WHOLE_SERVER = ""  # the health service's name for the server as a whole


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ready: bool
    detail: str  # "SERVING", "HTTP 200", or why not


def probe_grpc(target: str, timeout_s: float, tls: InternalTls | None = None) -> ProbeResult:
    """Asks `target` ("host:port") whether it is SERVING, via grpc.health.v1.Health/Check; over
    mutual TLS with `tls`, else in plaintext."""
    channel = (grpc.insecure_channel(target) if tls is None
               else grpc.secure_channel(target, tls.channel_credentials(), options=tls.channel_options()))
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=_WHOLE_SERVER),
                                  timeout=timeout_s, wait_for_ready=False)
        except grpc.RpcError as error:
            return ProbeResult(False, f"{error.code().name}: {error.details()}")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return ProbeResult(response.status == health_pb2.HealthCheckResponse.SERVING, status)


def probe_http(url: str, timeout_s: float) -> ProbeResult:
    """GETs `url`; ready when it answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return ProbeResult(response.status == 200, f"HTTP {response.status}")
    except urllib.error.HTTPError as error:
        return ProbeResult(False, f"HTTP {error.code}")
    except (urllib.error.URLError, OSError) as error:
        return ProbeResult(False, str(getattr(error, "reason", error)))


def probe(target: str, timeout_s: float, tls: InternalTls | None = None) -> ProbeResult:
    """An http:// or https:// URL gets an HTTP probe, anything else ("host:port") a gRPC one,
    with `tls` when given."""
    if target.startswith(("http://", "https://")):
        return probe_http(target, timeout_s)
    return probe_grpc(target, timeout_s, tls)
