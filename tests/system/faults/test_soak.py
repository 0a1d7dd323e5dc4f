"""The chaos soak's short version (tests/system/faults/soak.py): 96 s of Poisson load through
`pdserve up --prefill 2 --decode 2` with a fault every 12 s drawn from a fixed seed (SIGKILL or
SIGSTOP of a replica, a Redis restart): no request lost, no answer changed, no KV block held and
no record left unfinished once the load stops; what fails, fails with UNAVAILABLE."""
import asyncio

import pytest

from tests.system.faults.soak import SoakConfig, run_soak
from tests.system.faults.up_deployment import start_up, stop_up

pytestmark = pytest.mark.faults

CONFIG = SoakConfig(seconds=96.0, every_s=12.0, rate_per_s=2.0, seed=7)  # 7 faults


@pytest.mark.timeout(600)
def test_seven_faults_under_load_lose_no_request_and_change_no_answer(fault_model, tmp_path):
    up = start_up(tmp_path, fault_model, "--prefill", "2", "--decode", "2")
    try:
        report = asyncio.run(run_soak(up, fault_model, CONFIG))
    finally:
        stop_up(up)
    print(f"\nsoak: {report}")
    assert len(report.faults) >= 7
    assert report.sound, report
    assert set(report.failed) <= {"UNAVAILABLE"}, report.failed
    assert report.answered >= 0.8 * report.sent
