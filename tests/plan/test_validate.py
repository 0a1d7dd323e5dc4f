"""Predicted-against-measured rows, on runs whose 'measurements' are known."""
import dataclasses

import pytest

from pdserve.planner.cpu_sharing import CpuDemand, CpuSharing
from pdserve.planner.profile import ServingOverhead
from pdserve.planner.simulate import XpYd, simulate
from pdserve.planner.report import plot_validation, validation_markdown
from pdserve.planner.speed import at_speed
from pdserve.planner.validate import check_runnable, compare_row
from pdserve.planner.workload import SimRequest, Slo

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
    # and each run's trace with its times, to replay another model on
    first = runs[0][0]
    assert row["records"][0][0] == [first.start_s, first.prompt_len, first.output_len, first.ttft_s, first.e2el_s]
    assert [len(records) for records in row["records"]] == [len(run) for run in runs]


def test_configurations_whose_replicas_would_share_cores_are_refused(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    check_runnable(XpYd(1, 1))
    with pytest.raises(ValueError):
        check_runnable(XpYd(1, 2))
    with pytest.raises(ValueError):
        check_runnable(dataclasses.replace(XpYd(1, 1), num_prefill=2))


def test_the_fronts_measured_cpu_is_set_beside_the_models():
    profile = make_profile(serving=ServingOverhead(cpu=CpuSharing(True, front=CpuDemand(0.02, 0.01))))
    run = simulated_run(profile, XpYd(1, 1))
    measured = [{"front": front_s, "prefill": 0.01, "decode": 0.02} for front_s in (0.1, 0.3, 0.2)]
    row = compare_row(profile, XpYd(1, 1), 10, [run] * 3, SLO, cpu_s_per_s=measured)
    trace = [SimRequest(r.start_s, r.prompt_len, r.output_len) for r in run]
    assert row["predicted"]["front_cpu_s_per_s"] == pytest.approx(simulate(profile, XpYd(1, 1), trace, SLO).front_cpu_s_per_s)
    assert row["measured"]["front_cpu_s_per_s"] == pytest.approx(0.2)
    assert row["measured"]["cpu_s_per_s"] == {"front": 0.2, "prefill": 0.01, "decode": 0.02}
    assert "front_cpu_s_per_s" not in row["ratios"]


def test_a_run_on_a_machine_half_as_fast_is_predicted_exactly_at_its_speed():
    """A system twice as slow in everything: the profile at its speed (the probe's or the served
    one) predicts it; at its own it predicts at most half of every latency (less where the slower
    system queues)."""
    single = {"kind": "single", "prompt_len": 512, "output_len": 8, "ttft_s": 0.1, "e2el_s": 0.2}
    profile = make_profile(serving=ServingOverhead(gateway_s=0.003, handoff_s=0.01, samples=[single]))
    profile = dataclasses.replace(profile, hardware={**profile.hardware, "reference_s": 0.001})
    slower = at_speed(profile, 0.002)
    row = compare_row(profile, XpYd(1, 1), 10, [simulated_run(slower, XpYd(1, 1))] * 3, SLO, references_s=[0.002] * 3,
                      served_scales=[2.0] * 3)
    assert len(row["ratios"]) == 4 and all(ratio < 0.51 for ratio in row["ratios"].values())
    assert not row["within_tolerance"]
    for variant in ("at_speed", "at_served_speed"):
        assert row[variant]["ratios"] == pytest.approx({key: 1 for key in row["ratios"]})
        assert row[variant]["within_tolerance"]
    assert row["at_speed"]["references_s"] == [0.002] * 3
    assert row["at_served_speed"]["scales"] == [2.0] * 3 and row["at_served_speed"]["profile_anchor_ttft_s"] == 0.1
    markdown = validation_markdown([row])
    assert "at the runs' speed" in markdown and "at served speed" in markdown


def test_rows_of_two_configurations_and_two_rates_plot_to_a_png(tmp_path):
    profile = make_profile()
    rows = [compare_row(profile, config, rate, [simulated_run(profile, config, scale) for scale in (0.9, 1.0, 1.2)], SLO)
            for config in (XpYd(1, 1), XpYd(1, 2)) for rate in (2, 4)]
    path = plot_validation(rows, tmp_path / "validation.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
