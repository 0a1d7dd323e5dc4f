"""Readiness probes against a real gRPC health service and a real HTTP server on loopback."""
import http.server
import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.cluster.health_probe import probe
from pdserve.cluster.ports import free_port


@pytest.fixture
def health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_grpc_probe_is_ready_only_while_the_server_says_serving(health_server):
    servicer, target = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert not probe(target, timeout_s=5).ready
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert probe(target, timeout_s=5).ready


def test_grpc_probe_of_a_closed_port_says_unavailable():
    result = probe(f"127.0.0.1:{free_port('127.0.0.1')}", timeout_s=5)
    assert not result.ready and result.detail.startswith("UNAVAILABLE")


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_http_probe_needs_status_200():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        assert probe(f"{base}/health", timeout_s=5).ready
        assert probe(f"{base}/other", timeout_s=5).detail == "HTTP 503"
    finally:
        server.shutdown()
        server.server_close()
