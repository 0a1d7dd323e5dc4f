"""`pdserve bench offline` without the peer: pdserve's offline engine alone, end to end."""
import json
import subprocess
import sys

from tests.helpers import ENGINE_FLAGS

NUM_PROMPTS = 4
OUTPUT_LEN = 4


def test_pdserve_alone_reports_its_throughput_and_skips_vllm(tiny_model, tmp_path):
    result_dir = tmp_path / "offline"
    completed = subprocess.run(
        [sys.executable, "-m", "pdserve", "bench", "offline", "--model", tiny_model(), *ENGINE_FLAGS,
         "--dtypes", "bfloat16", "--num-prompts", str(NUM_PROMPTS), "--output-len", str(OUTPUT_LEN), "--num-runs", "2",
         "--result-dir", str(result_dir)],
        capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip() == str(result_dir / "offline.json")
    assert "pdserve bfloat16: timed run 2/2" in (result_dir / "logs" / "pdserve_bfloat16.log").read_text()

    combined = json.loads((result_dir / "offline.json").read_text())
    assert list(combined["dtypes"]) == ["bfloat16"]
    input_lens = combined["workload"]["input_lens"]
    assert 40 <= input_lens["min"] <= input_lens["max"] <= 550
    engines = combined["dtypes"]["bfloat16"]["engines"]
    assert engines["vllm"]["status"] == "skipped"
    pdserve = engines["pdserve"]
    assert pdserve["status"] == "ok", pdserve.get("note")
    assert len(pdserve["timed_s"]) == 2
    assert pdserve["num_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN  # ignore_eos: every token generated
    assert pdserve["num_prompt_tokens"] == input_lens["total"]
    assert pdserve["output_tok_per_s"] == pdserve["num_output_tokens"] / pdserve["seconds"]
    assert combined["dtypes"]["bfloat16"]["num_same_outputs"] is None

    table = (result_dir / "offline.md").read_text()
    assert "| bfloat16 | pdserve |" in table and "vllm bfloat16: skipped" in table
    assert not (result_dir / "offline.png").exists()  # the table is the report
