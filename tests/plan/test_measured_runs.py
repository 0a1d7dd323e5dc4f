"""The measuring steps end to end on a fake system that answers as the simulation does: what
they send, read and return, without launching anything."""
import contextlib
import dataclasses
import math
import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.metrics import compute_metrics
from pdserve.bench.records import RequestRecord
from pdserve.bench.runner import BenchConfig, BenchResult
from pdserve.planner import served_speed, serving, validate
from pdserve.planner.profile import DecodeFit, PrefillFit, ServingOverhead
from pdserve.planner.simulate import Simulation, XpYd
from pdserve.planner.workload import SimRequest, Slo

from tests.plan.profiles import make_profile

ENGINE = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7))
TRUTH = ServingOverhead(gateway_s=0.008, ttft_s=0.006, handoff_s=0.012, step_s=0.0015, per_seq_step_s=0.0003)
SERVED = make_profile(prefill=ENGINE.prefill, decode=ENGINE.decode, serving=TRUTH)


@contextlib.contextmanager
def _launched(*args, **kwargs):
    yield SimpleNamespace(spec=SimpleNamespace(base_url="http://fake/v1"), pid=os.getpid())


def _random_requests(model_dir, num_prompts, input_len, output_len, seed, range_ratio=0.0, dataset="random"):
    return [BenchRequest(None, [1] * input_len, output_len) for _ in range(num_prompts)]


_ENGINE_WORK_S = {}  # the last fake run's engine work, by kind, for _cpu_during to report


def _bench(base_url, requests, label, request_rate=math.inf, max_concurrency=None, **options):
    gap_s = 0.0 if math.isinf(request_rate) else 1 / request_rate
    if max_concurrency == 1:
        gap_s = max(gap_s, 10.0)  # one at a time: each alone
    trace = [SimRequest(i * gap_s, len(r.prompt_token_ids), r.output_len) for i, r in enumerate(requests)]
    simulation = Simulation(SERVED, XpYd(1, 1))
    times = simulation.run(trace)
    _ENGINE_WORK_S.update(simulation.engine_work_s)
    records = [RequestRecord(prompt_len=r.prompt_len, output_len=r.output_len, ttft_s=t.ttft_s, itl_s=[],
                             e2el_s=t.finish_s - t.arrival_s, success=True, error="", start_s=r.arrival_s)
               for r, t in zip(trace, times)]
    return BenchResult(config=BenchConfig(backend="openai", target=base_url), model_id="m", date="",
                       records=records, metrics=compute_metrics(records, 1.0), server=None)


def _cpu_during(system_pid, call):
    """A fake reading: each engine's work in the system `_bench` fakes, and nothing beside them,
    so that no step is slowed there either."""
    _ENGINE_WORK_S.clear()
    started_s = time.monotonic()
    result = call()
    wall_s = max(time.monotonic() - started_s, 1e-3)
    return result, {"front": 0.0, "prefill_engine": _ENGINE_WORK_S.get("prefill", 0.0),
                    "decode_engine": _ENGINE_WORK_S.get("decode", 0.0), "prefill": 0.0, "decode": 0.0}, wall_s


class _SteadyProbe:
    """The machine's speed as the fake system has it: the same in every window."""

    def __init__(self, model_dir):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def read_s(self):
        return 0.001


@pytest.fixture
def fake_system(monkeypatch):
    monkeypatch.setattr(validate, "SpeedProbe", _SteadyProbe)
    for module in (serving, validate):
        monkeypatch.setattr(module, "launched", _launched)
        monkeypatch.setattr(module, "cpu_during", _cpu_during)
    for module in (serving, validate, served_speed):
        monkeypatch.setattr(module, "bench", _bench)
        monkeypatch.setattr(module, "random_requests", _random_requests)


def test_the_serving_profile_reads_overheads_spreads_and_the_cpu_beside_the_engines(fake_system, tmp_path):
    config = serving.ServingRunConfig(model_dir=Path("model"), log_dir=tmp_path, idle_window_s=0.01)
    profile = serving.measure_serving(ENGINE, config)
    measured = profile.serving
    # the engine as served does what the fake system's engine did: the fits alone, plus the
    # per-step overheads its decode steps spend as work
    assert dataclasses.astuple(profile.prefill) == pytest.approx(dataclasses.astuple(ENGINE.prefill))
    # (within a few %: a wave's steps are an estimate)
    assert profile.decode.intercept_s == pytest.approx(
        ENGINE.decode.intercept_s + TRUTH.step_s - TRUTH.per_seq_step_s, rel=0.05)
    assert profile.decode.per_seq_s == pytest.approx(ENGINE.decode.per_seq_s + TRUTH.per_seq_step_s, rel=0.1)
    # the steps' estimate leaves a little in the join term, which the handoff then gives up
    assert profile.decode.per_join_s < 0.1 * TRUTH.handoff_s
    assert measured.engine_alone["decode"] == dataclasses.asdict(ENGINE.decode)
    assert measured.handoff_s + profile.decode.per_join_s == pytest.approx(TRUTH.handoff_s, rel=0.02)
    assert (measured.step_s, measured.per_seq_step_s) == pytest.approx((0.0, 0.0), abs=1e-4)  # all of it in the fit
    # a system that behaves as modelled leaves the staggered requests' TTFTs nothing to explain
    # (the gateway's share of the idle TTFT overhead, read from the waves, is not exact: a few ms
    # either way, none of it a light load's)
    staggered_ttfts_s = [sample["ttft_s"] for sample in measured.samples if sample["kind"] == "staggered"]
    assert len(measured.ttft_delays_s) == len(staggered_ttfts_s) == 3 * 3 * config.num_staggered
    assert statistics.median(measured.ttft_delays_s) == pytest.approx(0.0, abs=5e-4)
    assert all(abs(delay_s) < 0.25 * ttft_s for delay_s, ttft_s in zip(measured.ttft_delays_s, staggered_ttfts_s))
    assert len(measured.handoff_residuals_s) == 40
    assert measured.cpu.shares_replica_cpus
    assert min(measured.cpu.front.per_request_s, measured.cpu.front.per_output_token_s,
               measured.cpu.front.per_decode_step_s) >= 0
    assert [r["label"] for r in measured.cpu_samples][:2] == ["idle", "single p64 o8"]
    assert sum(r["num_requests"] for r in measured.cpu_samples[1:]) == 40 + 2 * (16 + 8 + 4)
    # a single's decode steps are its tokens less one; a wave's, its length less one and the
    # steps its prompts join over
    assert [r["num_decode_steps"] for r in measured.cpu_samples[1:5]] == [70, 630, 70, 630]
    assert all(r["output_len"] - 1 < r["num_decode_steps"] < r["output_len"] - 1 + 3 * r["batch_size"]
               for r in measured.cpu_samples[5:])
    assert [r["batch_size"] for r in measured.cpu_samples[1:]] == [1, 1, 1, 1, 16, 16, 8, 8, 4, 4]
    # staggered runs: three of each of the three shapes, the TPOT calibration's, not the CPU's
    assert sum(s["kind"] == "staggered" for s in measured.samples) == 3 * 3 * config.num_staggered


def test_validation_of_a_system_that_behaves_as_modelled(fake_system, tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    labels = []
    monkeypatch.setattr(validate, "bench", lambda url, requests, label, **options: (
        labels.append(label), _bench(url, requests, label, **options))[1])
    # the profile's singles of the anchor shape, as the fake system answers them
    singles = _bench("", _random_requests(None, 3, 512, 8, 0), "singles", max_concurrency=1).records
    profile = dataclasses.replace(SERVED, serving=dataclasses.replace(SERVED.serving, samples=[
        {"kind": "single", "prompt_len": 512, "output_len": 8, "ttft_s": r.ttft_s, "e2el_s": r.e2el_s}
        for r in singles]))
    config = validate.ValidationConfig(
        profile=profile, model_dir=Path("model"), configs=(XpYd(1, 1),), request_rates=(5.0, 2.0), num_prompts=30,
        input_len=64, output_len=8, range_ratio=0.0, slo=Slo(500, 50), log_dir=tmp_path, num_repeats=2)
    rows = validate.validate(config)
    assert [row["request_rate"] for row in rows] == [5.0, 2.0]
    # round robin: each rate's runs spread over the validation
    assert [label for label in labels if "rate" in label] == [
        "1P1D rate 5 run 1", "1P1D rate 2 run 1", "1P1D rate 5 run 2", "1P1D rate 2 run 2"]
    for row in rows:
        assert row["within_tolerance"] and row["ratios"]["p50_ttft_ms"] == pytest.approx(1)
        assert row["measured"]["front_cpu_s_per_s"] >= 0 and row["predicted"]["front_cpu_s_per_s"] == 0
        assert row["at_speed"]["references_s"] == [0.001, 0.001]  # each run's, read around it
        # the anchors run as fast as the profile's singles did
        assert row["at_served_speed"]["scales"] == pytest.approx([1.0, 1.0])
        assert row["at_served_speed"]["ratios"] == pytest.approx(row["ratios"])


def test_a_profile_without_singles_is_validated_without_a_served_speed(fake_system, tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    config = validate.ValidationConfig(
        profile=SERVED, model_dir=Path("model"), configs=(XpYd(1, 1),), request_rates=(5.0,), num_prompts=10,
        input_len=64, output_len=8, range_ratio=0.0, slo=Slo(500, 50), log_dir=tmp_path, num_repeats=1)
    [row] = validate.validate(config)
    assert "at_served_speed" not in row and row["at_speed"]["references_s"] == [0.001]
