"""`pdserve bench goodput` end to end: two real systems started once each, searched over rates,
stopped; TTFT at idle split into the servers' parts; the JSON, markdown and attainment plot written."""
import json
import subprocess
import sys

import pytest

from tests.helpers import ENGINE_FLAGS

pytestmark = pytest.mark.e2e

NUM_PROMPTS = 4


def test_goodput_of_two_systems_side_by_side(tiny_model, tmp_path):
    result_dir = tmp_path / "goodput"
    completed = subprocess.run(
        [sys.executable, "-m", "pdserve", "bench", "goodput", "--model", tiny_model(), *ENGINE_FLAGS,
         "--systems", "colocated,disaggregated", "--rates", "1,4", "--num-prompts", str(NUM_PROMPTS),
         "--input-len", "12", "--output-len", "4", "--duration-s", "0", "--num-warmup-prompts", "1",
         "--num-idle-prompts", "2", "--slo", "ttft:60000", "tpot:60000", "--result-dir", str(result_dir)],
        capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip() == str(result_dir / "goodput.json")

    combined = json.loads((result_dir / "goodput.json").read_text())
    assert list(combined["systems"]) == ["colocated", "disaggregated"]
    for name, entry in combined["systems"].items():
        assert entry["status"] == "ok", entry.get("reason")
        (search,) = entry["repeats"]
        assert [point["request_rate"] for point in search["points"]] == [1.0, 4.0]
        for point in search["points"]:
            assert point["attainment"] == 1.0, (name, point)  # a minute per token: every request meets it
            assert (point["figures"]["completed"], point["figures"]["failed"]) == (NUM_PROMPTS, 0)
        # Every engine's steps during each point: serve's one engine, up's prefill and decode replicas
        # (their figures as last reported, twice a second: the first point's seconds of arrivals hold reports).
        names = {"engine"} if name == "colocated" else {"prefill-0", "decode-0"}
        assert [set(point["figures"]["engines"]) for point in search["points"]] == [names] * 2
        engines = search["points"][0]["figures"]["engines"].values()
        assert sum(engine["prompt_tokens"] for engine in engines) > 0
        assert sum(engine["busy_s"]["decode"] + engine["busy_s"]["prompt"] for engine in engines) > 0
        assert (entry["goodput"], entry["at_least"]) == (4.0, True)
        idle = entry["idle"]
        assert 0 < idle["server_ttft_ms"] <= idle["client_ttft_ms"], idle
        assert idle["server_queue_ms"] >= 0 and idle["server_prefill_ms"] > 0 and idle["second_token_ms"] > 0
    assert combined["systems"]["disaggregated"]["idle"]["kv_transfer_ms"] > 0
    markdown = (result_dir / "goodput.md").read_text()
    assert "| colocated | ≥ 4 |" in markdown and "## disaggregated" in markdown and "At idle" in markdown
    assert "engines busy (% of the run, by step)" in markdown and "decode-0 " in markdown
    assert (result_dir / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (result_dir / "logs" / "disaggregated.log").stat().st_size > 0
