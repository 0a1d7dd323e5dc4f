import json
import time

import pytest

from pdserve.cli import main
from pdserve.planner.profile import PrefillFit, Profile

from tests.plan.profiles import make_profile

SLO_FLAGS = ["--ttft-slo-ms", "200", "--tpot-slo-ms", "20"]


@pytest.fixture
def profile_path(tmp_path):
    profile = make_profile(prefill=PrefillFit(0.005, 1e-4, 0.0))
    return str(profile.save(tmp_path / "profile.json"))


def test_simulate_prints_a_row_per_configuration_and_writes_them(profile_path, tmp_path, capsys):
    assert main(["plan", "simulate", "--profile", profile_path, "--config", "1P1D", "--config", "2P3D",
                 "--request-rate", "10", "--num-prompts", "100", *SLO_FLAGS, "--result-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 1P1D |" in out and "| 2P3D |" in out
    rows = json.loads((tmp_path / "simulate.json").read_text())["rows"]
    assert [row["config"] for row in rows] == ["1P1D", "2P3D"]
    assert all(row["p90_ttft_ms"] >= row["median_ttft_ms"] > 0 for row in rows)


def test_recommend_sweeps_every_split_and_writes_table_and_plot(profile_path, tmp_path):
    started = time.monotonic()
    assert main(["plan", "recommend", "--profile", profile_path, "--gpus", "4,6", "--rate-per-gpu", "5",
                 "--num-prompts", "100", *SLO_FLAGS, "--result-dir", str(tmp_path)]) == 0
    assert time.monotonic() - started < 30
    fleet = json.loads((tmp_path / "fleet.json").read_text())
    assert [len(entry["candidates"]) for entry in fleet["fleets"]] == [3, 5]
    for entry in fleet["fleets"]:
        best = max(c["slo_attainment"] for c in entry["candidates"])
        assert entry["recommended"]["slo_attainment"] >= best - 0.005
    assert (tmp_path / "fleet.png").stat().st_size > 0
    assert "| 4 | 20 |" in (tmp_path / "fleet.md").read_text()


def test_a_malformed_configuration_is_refused():
    with pytest.raises(SystemExit):
        main(["plan", "simulate", "--profile", "p.json", "--config", "1x1", "--request-rate", "1", *SLO_FLAGS])


def test_a_profile_of_an_earlier_planner_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**make_profile().to_json_dict(), "schema_version": 3}))
    with pytest.raises(SystemExit, match="plan profile"):
        main(["plan", "simulate", "--profile", str(path), "--config", "1P1D", "--request-rate", "1", *SLO_FLAGS])


def test_profile_measures_the_tiny_model_quickly(tiny_model, tmp_path):
    out = tmp_path / "profile.json"
    started = time.monotonic()
    assert main(["plan", "profile", "--model", tiny_model(), "--out", str(out), "--repeats", "2",
                 "--prefill-prompt-lens", "16,64,256", "--prefill-num-seqs", "1,4", "--decode-num-seqs", "1,8",
                 "--decode-context-lens", "32,128"]) == 0
    assert time.monotonic() - started < 60
    profile = Profile.load(out)
    assert len(profile.prefill_samples) == 6 and len(profile.decode_samples) == 4
    assert all(sample.step_s > 0 for sample in profile.prefill_samples + profile.decode_samples)
    # a prompt of 256 tokens costs more than one of 16
    assert profile.prefill.step_s([(0, 256)]) > profile.prefill.step_s([(0, 16)])
    assert profile.kv_bytes_per_token > 0 and profile.transfer_gb_per_s > 0
    assert profile.hardware["device"] == "cpu"
