"""Predicted-against-measured rows, on runs whose 'measurements' are known."""
import dataclasses

import pytest

from pdserve.planner.profile import ServingOverhead
from pdserve.planner.report import plot_validation, validation_markdown
from pdserve.planner.simulate import XpYd
from pdserve.planner.validate import check_runnable, compare_row
from pdserve.planner.workload import Slo

from tests.plan.profiles import make_profile, simulated_run

SLO = Slo(ttft_ms=500, tpot_ms=50)


def test_a_system_that_behaves_as_modelled_is_predicted_exactly():
    profile = make_profile(serving=ServingOverhead(gateway_s=0.003, handoff_s=0.01))
    row = compare_row(profile, XpYd(1, 1), 10, [simulated_run(profile, XpYd(1, 1))] * 3, SLO)
    assert row["ratios"] == pytest.approx({"p50_ttft_ms": 1, "p90_ttft_ms": 1, "p50_tpot_ms": 1, "p90_tpot_ms": 1})
    assert row["within_tolerance"] and row["num_repeats"] == 3


def test_a_ttft_two_fifths_longer_than_predicted_is_outside_the_tolerance():
    profile = make_profile()
    row = compare_row(profile, XpYd(1, 1), 10, [simulated_run(profile, XpYd(1, 1), ttft_scale=1.4)], SLO)
    assert row["ratios"]["p50_ttft_ms"] == pytest.approx(1 / 1.4)
    assert row["ratios"]["p50_tpot_ms"] == pytest.approx(1)
    assert not row["within_tolerance"]


def test_the_row_takes_the_median_of_the_repeats():
    profile = make_profile()
    runs = [simulated_run(profile, XpYd(1, 1), scale) for scale in (1.0, 2.0, 10.0)]
    row = compare_row(profile, XpYd(1, 1), 10, runs, SLO)
    assert row["measured"]["p50_ttft_ms"] == pytest.approx(row["measured_runs"][1]["p50_ttft_ms"])
    assert row["ratios"]["p50_ttft_ms"] == pytest.approx(0.5)
    # each run's own prediction is kept beside its measurement (here the same trace each time)
    assert [run["p50_ttft_ms"] for run in row["predicted_runs"]] == [row["predicted"]["p50_ttft_ms"]] * 3


def test_configurations_whose_replicas_would_share_cores_are_refused(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    check_runnable(XpYd(1, 1))
    with pytest.raises(ValueError):
        check_runnable(XpYd(1, 2))
    with pytest.raises(ValueError):
        check_runnable(dataclasses.replace(XpYd(1, 1), num_prefill=2))


def test_rows_of_two_configurations_and_two_rates_tabulate_and_plot_to_a_png(tmp_path):
    profile = make_profile()
    rows = [compare_row(profile, config, rate, [simulated_run(profile, config, scale) for scale in (0.9, 1.0, 1.2)], SLO)
            for config in (XpYd(1, 1), XpYd(1, 2)) for rate in (2, 4)]
    path = plot_validation(rows, tmp_path / "validation.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = validation_markdown(rows)
    assert markdown.count("| 1P2D | 4 |") == 1 and "| within 25% |" in markdown
