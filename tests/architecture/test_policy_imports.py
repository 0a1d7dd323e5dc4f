"""Policy modules are pure Python: importing one pulls in neither torch, grpc, protobuf nor
redis, so the decisions they make are testable and reusable anywhere."""
import subprocess
import sys

import pytest

POLICY_MODULES = [
    "pdserve.engine.block_allocator",
    "pdserve.engine.scheduler",
    "pdserve.engine.request",
    "pdserve.decode_svc.reservations",
    "pdserve.gateway.disaggregated.router",
    "pdserve.gateway.disaggregated.pairing",
    "pdserve.cluster.registry_entry",
    "pdserve.gateway.front.request_state",
]
HEAVY = ("torch", "grpc", "google.protobuf", "redis")


@pytest.mark.parametrize("module", POLICY_MODULES)
def test_policy_module_imports_nothing_heavy(module):
    code = f"import sys, {module}; print([m for m in {HEAVY!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
