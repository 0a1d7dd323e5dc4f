"""Replaying a validation: its recorded runs predicted with another profile, its measured
figures unchanged; with its own profile, its rows as they were."""
import dataclasses
import json

import pytest

from pdserve.cli import main
from pdserve.planner.profile import ServingOverhead
from pdserve.planner.replay import replay
from pdserve.planner.simulate import XpYd
from pdserve.planner.speed import at_speed
from pdserve.planner.validate import compare_row
from pdserve.planner.workload import Slo

from tests.plan.profiles import make_profile, simulated_run

SLO = Slo(ttft_ms=500, tpot_ms=50)


def _profile(anchor_ttft_s: float = 0.1):
    single = {"kind": "single", "prompt_len": 512, "output_len": 8, "ttft_s": anchor_ttft_s, "e2el_s": 0.2}
    profile = make_profile(serving=ServingOverhead(gateway_s=0.003, handoff_s=0.01, samples=[single]))
    return dataclasses.replace(profile, hardware={**profile.hardware, "reference_s": 0.001})


def _validation(profile, runs, references_s, served_scales) -> dict:
    """As `plan validate` writes it, through JSON."""
    cpu_s_per_s = [{"front": 0.1, "prefill": 0.01, "decode": 0.02}] * len(runs)
    row = {**compare_row(profile, XpYd(1, 1), 10, runs, SLO, cpu_s_per_s, references_s, served_scales),
           "load_average_1m": 0.5}
    return json.loads(json.dumps({"slo": dataclasses.asdict(SLO), "workload": {"num_prompts": 200}, "rows": [row]}))


def test_a_validation_replayed_with_its_own_profile_gives_its_rows_back():
    profile = _profile()
    runs = [simulated_run(profile, XpYd(1, 1), scale) for scale in (1.0, 1.3)]
    validation = _validation(profile, runs, [0.001, 0.0012], [1.0, 1.2])
    assert json.loads(json.dumps(replay(profile, validation))) == validation["rows"]


def test_runs_of_a_slower_system_replayed_with_its_profile_are_predicted_exactly():
    profile = _profile()
    slower = at_speed(profile, 0.002)
    validation = _validation(profile, [simulated_run(slower, XpYd(1, 1))] * 2, [0.001] * 2, [1.0] * 2)
    assert not validation["rows"][0]["within_tolerance"]
    (row,) = replay(dataclasses.replace(slower, hardware={**slower.hardware, "reference_s": 0.002}), validation)
    assert row["ratios"] == pytest.approx({key: 1 for key in row["ratios"]})
    assert row["measured"] == validation["rows"][0]["measured"]
    # the runs' speed is the machine's, read around them: the replayed profile's at that speed is the fast one
    assert row["at_speed"]["ratios"]["p50_ttft_ms"] == pytest.approx(validation["rows"][0]["ratios"]["p50_ttft_ms"])


def test_the_served_speed_is_read_against_the_replayed_profiles_anchor():
    validation = _validation(_profile(anchor_ttft_s=0.1), [simulated_run(_profile(), XpYd(1, 1))], [0.001], [2.0])
    (row,) = replay(_profile(anchor_ttft_s=0.2), validation)
    assert row["at_served_speed"]["scales"] == pytest.approx([1.0])  # the same anchor TTFT, 0.2 s
    assert row["at_served_speed"]["ratios"] == pytest.approx({key: 1 for key in row["ratios"]})


def test_plan_replay_writes_its_table_json_and_plot(tmp_path):
    profile = _profile()
    runs_path = tmp_path / "validation.json"
    runs_path.write_text(json.dumps(_validation(profile, [simulated_run(profile, XpYd(1, 1))], [0.001], [1.0])))
    profile_path = profile.save(tmp_path / "profile.json")
    assert main(["plan", "replay", "--profile", str(profile_path), "--runs", str(runs_path),
                 "--result-dir", str(tmp_path / "out")]) == 0
    replayed = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert replayed["runs"] == str(runs_path) and replayed["rows"][0]["within_tolerance"]
    assert (tmp_path / "out" / "replay.png").read_bytes()[:4] == b"\x89PNG"
