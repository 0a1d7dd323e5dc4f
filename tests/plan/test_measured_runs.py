"""The serving profile end to end on a fake system that answers as the simulation does: what it
sends, reads and returns through bench's systems and runner, without launching anything."""
import contextlib
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdserve.bench.datasets import BenchRequest
from pdserve.bench.metrics import compute_metrics
from pdserve.bench.records import RequestRecord
from pdserve.bench.runner import BenchConfig, BenchResult
from pdserve.planner import serving
from pdserve.planner.profile import DecodeFit, PrefillFit, ServingOverhead
from pdserve.planner.simulate import Simulation, XpYd
from pdserve.planner.workload import SimRequest

from tests.plan.profiles import make_profile

ENGINE = make_profile(prefill=PrefillFit(0.004, 5e-5, 0.0), decode=DecodeFit(0.004, 2e-4, 1e-7))
TRUTH = ServingOverhead(gateway_s=0.008, ttft_s=0.006, handoff_s=0.012, step_s=0.0015, per_seq_step_s=0.0003)
SERVED = make_profile(prefill=ENGINE.prefill, decode=ENGINE.decode, serving=TRUTH)


@contextlib.contextmanager
def _started(name, options, pinning, log_dir):
    assert (name, options.num_prefill_replicas, options.num_decode_replicas) == ("disaggregated", 1, 1)
    yield SimpleNamespace(spec=SimpleNamespace(base_url="http://fake/v1"))


def _make_dataset(kind, *, num_prompts, seed, input_len, output_len, tokenizer):
    return [BenchRequest(None, [1] * input_len, output_len) for _ in range(num_prompts)]


def _run_on(system, requests, label, request_rate=math.inf, max_concurrency=None, **options):
    gap_s = 0.0 if math.isinf(request_rate) else 1 / request_rate
    if max_concurrency == 1:
        gap_s = max(gap_s, 10.0)  # one at a time: each alone
    trace = [SimRequest(i * gap_s, len(r.prompt_token_ids), r.output_len) for i, r in enumerate(requests)]
    times = Simulation(SERVED, XpYd(1, 1)).run(trace)
    records = [RequestRecord(prompt_len=r.prompt_len, output_len=r.output_len, ttft_s=t.ttft_s, itl_s=[],
                             e2el_s=t.finish_s - t.arrival_s, success=True, error="", start_s=r.arrival_s)
               for r, t in zip(trace, times)]
    return BenchResult(config=BenchConfig(backend="openai", target=system.spec.base_url), model_id="m", date="",
                       records=records, metrics=compute_metrics(records, 1.0), server=None)


@pytest.fixture
def fake_system(monkeypatch):
    monkeypatch.setattr(serving, "started", _started)
    monkeypatch.setattr(serving, "run_on", _run_on)
    monkeypatch.setattr(serving, "make_dataset", _make_dataset)
    monkeypatch.setattr("pdserve.protocol.tokenizer.load_tokenizer", lambda model_dir: None)


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

