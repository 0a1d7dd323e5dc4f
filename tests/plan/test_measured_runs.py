"""The measuring steps end to end on a fake system that answers as the simulation does: what
they send, read and return, without launching anything."""
import contextlib
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.metrics import compute_metrics
from pdserve.bench.records import RequestRecord
from pdserve.bench.runner import BenchConfig, BenchResult
from pdserve.planner import serving, validate
from pdserve.planner.profile import DecodeFit, PrefillFit, ServingOverhead
from pdserve.planner.simulate import Simulation, XpYd
from pdserve.planner.workload import SimRequest, Slo

from tests.plan.profiles import make_profile

ENGINE = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7))
TRUTH = ServingOverhead(gateway_s=0.008, ttft_s=0.006, handoff_s=0.012, step_s=0.0015, per_seq_step_s=0.0003)
SERVED = make_profile(prefill=ENGINE.prefill, decode=ENGINE.decode, serving=TRUTH)


@contextlib.contextmanager
def _launched(*args, **kwargs):
    yield SimpleNamespace(spec=SimpleNamespace(base_url="http://fake/v1"))


def _random_requests(model_dir, num_prompts, input_len, output_len, seed, range_ratio=0.0, dataset="random"):
    return [BenchRequest(None, [1] * input_len, output_len) for _ in range(num_prompts)]


def _bench(base_url, requests, label, request_rate=math.inf, max_concurrency=None, **options):
    gap_s = 0.0 if math.isinf(request_rate) else 1 / request_rate
    if max_concurrency == 1:
        gap_s = max(gap_s, 10.0)  # one at a time: each alone
    trace = [SimRequest(i * gap_s, len(r.prompt_token_ids), r.output_len) for i, r in enumerate(requests)]
    times = Simulation(SERVED, XpYd(1, 1)).run(trace)
    records = [RequestRecord(prompt_len=r.prompt_len, output_len=r.output_len, ttft_s=t.ttft_s, itl_s=[],
                             e2el_s=t.finish_s - t.arrival_s, success=True, error="", start_s=r.arrival_s)
               for r, t in zip(trace, times)]
    return BenchResult(config=BenchConfig(backend="openai", target=base_url), model_id="m", date="",
                       records=records, metrics=compute_metrics(records, 1.0), server=None)


@pytest.fixture
def fake_system(monkeypatch):
    for module in (serving, validate):
        monkeypatch.setattr(module, "launched", _launched)
        monkeypatch.setattr(module, "bench", _bench)
        monkeypatch.setattr(module, "random_requests", _random_requests)


def test_the_serving_profile_reads_the_overheads_of_a_system_that_behaves_as_modelled(fake_system, tmp_path):
    config = serving.ServingRunConfig(model_dir=Path("model"), log_dir=tmp_path)
    measured = serving.measure_serving_overhead(ENGINE, config)
    assert (measured.ttft_s + measured.gateway_s, measured.handoff_s, measured.step_s) == pytest.approx(
        (TRUTH.ttft_s + TRUTH.gateway_s, TRUTH.handoff_s, TRUTH.step_s), rel=0.02)
    assert measured.gateway_s == pytest.approx(TRUTH.gateway_s, rel=0.25)
    assert measured.per_seq_step_s == pytest.approx(TRUTH.per_seq_step_s, rel=0.05)
    # 10 singles at each of four lengths, two waves of each of three shapes, three staggered
    # runs of each of three shapes
    kinds = [sample["kind"] for sample in measured.samples]
    assert (kinds.count("single"), kinds.count("wave"), kinds.count("staggered")) == (
        40, 2 * (16 + 8 + 4), 3 * 3 * config.num_staggered)


def test_validation_of_a_system_that_behaves_as_modelled(fake_system, tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    labels = []
    monkeypatch.setattr(validate, "bench", lambda url, requests, label, **options: (
        labels.append(label), _bench(url, requests, label, **options))[1])
    config = validate.ValidationConfig(
        profile=SERVED, model_dir=Path("model"), configs=(XpYd(1, 1),), request_rates=(5.0, 2.0), num_prompts=30,
        input_len=64, output_len=8, range_ratio=0.0, slo=Slo(500, 50), log_dir=tmp_path, num_repeats=2)
    rows = validate.validate(config)
    assert [row["request_rate"] for row in rows] == [5.0, 2.0]
    # round robin: each rate's runs spread over the validation
    assert [label for label in labels if "rate" in label] == [
        "1P1D rate 5 run 1", "1P1D rate 2 run 1", "1P1D rate 5 run 2", "1P1D rate 2 run 2"]
    for row in rows:
        assert row["within_tolerance"] and row["ratios"]["p50_ttft_ms"] == pytest.approx(1)
        assert len(row["measured_runs"]) == len(row["predicted_runs"]) == 2
