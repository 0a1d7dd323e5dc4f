"""The report layer: `pdserve bench report` redraws the kept runs' tables exactly from their JSON,
and the headline's figures and goals are functions of that JSON."""
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.bench import report_headline
from pdserve.bench.cli import WORKLOADS
from pdserve.cli import main as pdserve_main

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
KEPT = tuple(sorted({path.parent.name for path in RESULTS.glob("*/*.json")}))  # every run kept with its JSON


@pytest.fixture
def results(tmp_path):
    for name in KEPT:
        shutil.copytree(RESULTS / name, tmp_path / name, ignore=shutil.ignore_patterns("*.png", "logs"))
    return tmp_path


def test_the_kept_tables_are_redrawn_exactly_from_their_json(results):
    assert pdserve_main(["bench", "report", str(results)]) == 0
    for name in KEPT:
        for table in (results / name).glob("*.md"):
            assert table.read_text() == (RESULTS / name / table.name).read_text(), table
    for name in ("goodput_bf16", "goodput_fp32"):  # the plots BENCHMARKS.md shows
        assert (results / name / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (results / "headline.md").read_text().startswith(report_headline.MARK_BEGIN)


def test_the_headline_in_benchmarks_md_is_the_one_the_json_gives(results, tmp_path):
    benchmarks = tmp_path / "BENCHMARKS.md"
    shutil.copy(RESULTS.parents[1] / "BENCHMARKS.md", benchmarks)
    before = benchmarks.read_text()
    assert pdserve_main(["bench", "report", str(results), "--benchmarks", str(benchmarks)]) == 0
    assert benchmarks.read_text() == before  # committed as generated


def run_of(goodputs: dict[str, list[float]], itl_ms: float = 100.0) -> dict:
    """A run where each system's search s met every rate up to goodputs[name][s] and missed the next."""
    rates = [1.0, 2.0, 3.0, 4.0]
    systems = {}
    for name, found in goodputs.items():
        repeats = [{"goodput": g, "at_least": False, "points": [
            {"request_rate": r, "attainment": 1.0 if r <= g else 0.5,
             "figures": {"median_tpot_ms": 10.0 * r, "p99_ttft_ms": 100.0 * r, "p99_itl_ms": itl_ms * r}}
            for r in rates if r <= g + 1]} for g in found]
        systems[name] = {"status": "ok", "goodput": sorted(found)[len(found) // 2], "goodput_per_repeat": found,
                         "idle": {"client_ttft_ms": 150.0}, "repeats": repeats}
    return {"workload": {"rates": rates, "target_attainment": 0.9}, "systems": systems}


def test_goodput_goals_are_the_ratios_of_the_medians():
    run = run_of({"disaggregated": [3.0], "colocated": [2.0], "vllm": [1.0]})
    assert report_headline.goal_ratio({"bfloat16": run}, "disaggregated", "vllm", 1.5)[2] == "bfloat16 met"
    goal, figures, met = report_headline.goal_ratio({"bfloat16": run}, "disaggregated", "colocated", 2.0)
    assert figures.startswith("bfloat16: 1.50x (3 against 2") and met == "bfloat16 not met"


def test_the_itl_goal_reads_every_point_up_to_each_searchs_goodput():
    run = run_of({"disaggregated": [2.0], "vllm": [3.0]}, itl_ms=40.0)
    assert report_headline.max_up_to_goodput(run["systems"]["disaggregated"], "p99_itl_ms") == 80.0
    assert report_headline.goal_itl({"bfloat16": run})[2] == "bfloat16 met"
    slow = run_of({"disaggregated": [3.0]}, itl_ms=40.0)
    assert report_headline.goal_itl({"bfloat16": slow})[1:] == ("bfloat16: 120 ms", "bfloat16 not met")


def test_up_attainment_is_compared_with_serves_at_each_rate_both_probed():
    run = run_of({"disaggregated": [3.0], "colocated": [2.0]})
    assert report_headline.goal_attainment({"bfloat16": run})[1:] == ("bfloat16: never below", "bfloat16 met")
    worse = run_of({"disaggregated": [1.0], "colocated": [2.0]})
    assert report_headline.goal_attainment({"bfloat16": worse})[1:] == (
        "bfloat16: below at 2 (50% against 100%)", "bfloat16 not met")


def test_the_probe_rate_is_the_highest_rate_every_search_measured():
    run = run_of({"disaggregated": [3.0], "vllm": [1.0]})
    assert report_headline.probe_rate(run) == 2.0
    missed = copy.deepcopy(run)
    assert report_headline.figure_at(missed["systems"]["vllm"], 2.0, "p99_ttft_ms", missed) == [None]  # missed there


def test_bench_help_lists_every_workload_and_loads_no_torch():
    code = ("import sys; from pdserve.cli import main\n"
            "try:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert all(name in shown for name in WORKLOADS) and shown.strip().endswith("False")
