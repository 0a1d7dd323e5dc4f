"""`pdserve bench-compare` end to end: real servers launched, measured and stopped in one run."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

NUM_PROMPTS = 4
OUTPUT_LEN = 4
PER_SYSTEM_FIELDS = ("completed", "failed", "output_throughput", "request_throughput", "mean_ttft_ms",
                     "p99_ttft_ms", "mean_itl_ms", "p99_itl_ms", "mean_tpot_ms", "ttfts", "itls", "errors",
                     "output_lens")


def test_two_systems_side_by_side_complete_every_request(tiny_model, tmp_path):
    result_dir = tmp_path / "compare"
    completed = subprocess.run(
        [sys.executable, "-m", "pdserve", "bench-compare", "--model", tiny_model(), "--systems", "static,colocated",
         "--num-prompts", str(NUM_PROMPTS), "--input-len", "16", "--output-len", str(OUTPUT_LEN),
         "--num-warmup-prompts", "1", "--result-dir", str(result_dir)],
        capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip() == str(result_dir / "compare.json")

    combined = json.loads((result_dir / "compare.json").read_text())
    assert set(combined) >= {"date", "command", "model", "workload", "pinning", "machine", "versions", "systems",
                             "ratios"}
    assert combined["workload"]["num_prompts"] == NUM_PROMPTS
    assert combined["model"]["hidden_size"] == 256 and combined["model"]["num_hidden_layers"] == 4
    assert set(combined["pinning"]) == {"server_cpus", "client_cpus", "server_threads"}
    assert list(combined["systems"]) == ["static", "colocated"]
    for name, entry in combined["systems"].items():
        assert entry["status"] == "ok", entry.get("note")
        result = entry["result"]
        assert set(result) >= set(PER_SYSTEM_FIELDS)
        assert (result["completed"], result["failed"]) == (NUM_PROMPTS, 0), name
        assert result["errors"] == [""] * NUM_PROMPTS
        assert result["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
        assert (result_dir / entry["log"]).is_file()
    assert combined["ratios"]["colocated"]["output_throughput/static"] > 0
    assert combined["ratios"]["colocated"]["output_throughput/vllm"] is None  # vLLM was not run

    table = (result_dir / "compare.md").read_text()
    assert "| static |" in table and "| colocated |" in table
    for png in ("compare_bars.png", "compare_cdf.png"):
        assert (result_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
