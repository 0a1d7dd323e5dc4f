"""Metric math on synthetic records with known timings: vLLM's definitions, exactly."""
import pytest

from pdserve.bench.errors import BenchConfigError
from pdserve.bench.metrics import compute_metrics
from pdserve.bench.records import RequestRecord


def record(ttft_s, itl_s, output_len, *, prompt_len=10, start_s=0.0, success=True):
    e2el_s = ttft_s + sum(itl_s)
    return RequestRecord(prompt_len=prompt_len, output_len=output_len if success else 0, ttft_s=ttft_s,
                         itl_s=itl_s, e2el_s=e2el_s, success=success, error="" if success else "boom",
                         start_s=start_s)


RECORDS = [
    record(0.1, [0.02, 0.02, 0.02], 4, start_s=0.0),    # tpot (0.16-0.1)/3 = 0.02, e2el 0.16
    record(0.3, [0.05], 2, start_s=0.5),                # tpot 0.05, e2el 0.35
    record(0.2, [], 1, prompt_len=30, start_s=1.0),     # one token: tpot 0, e2el 0.2
    record(0.4, [0.1], 5, start_s=1.1, success=False),  # failed: counts only in `failed`
]


def test_counts_totals_and_throughputs():
    figures = compute_metrics(RECORDS, duration_s=2.0).to_dict()
    assert figures["completed"] == 3 and figures["failed"] == 1
    assert figures["total_input_tokens"] == 10 + 10 + 30
    assert figures["total_output_tokens"] == 4 + 2 + 1
    assert figures["request_throughput"] == pytest.approx(1.5)
    assert figures["output_throughput"] == pytest.approx(3.5)
    assert figures["total_token_throughput"] == pytest.approx(28.5)
    assert figures["request_goodput"] is None  # no SLO given


def test_latency_summaries_follow_vllm():
    figures = compute_metrics(RECORDS, duration_s=2.0).to_dict()
    assert figures["mean_ttft_ms"] == pytest.approx(200.0)
    assert figures["median_ttft_ms"] == pytest.approx(200.0)
    assert figures["p90_ttft_ms"] == pytest.approx(280.0)  # linear between 200 and 300
    assert figures["p99_ttft_ms"] == pytest.approx(298.0)
    assert figures["std_ttft_ms"] == pytest.approx((20000 / 3) ** 0.5)
    assert figures["mean_tpot_ms"] == pytest.approx((20 + 50 + 0) / 3)
    assert figures["median_tpot_ms"] == pytest.approx(20.0)
    assert figures["mean_itl_ms"] == pytest.approx((20 * 3 + 50) / 4)  # gaps of every request, pooled
    assert figures["median_itl_ms"] == pytest.approx(20.0)
    assert figures["p99_e2el_ms"] == pytest.approx(200 + 0.98 * 150)
    assert figures["mean_e2el_ms"] == pytest.approx((160 + 350 + 200) / 3)


def test_goodput_counts_requests_within_every_slo_per_second():
    assert compute_metrics(RECORDS, 2.0, {"ttft": 250}).request_goodput == pytest.approx(1.0)
    assert compute_metrics(RECORDS, 2.0, {"ttft": 250, "tpot": 10}).request_goodput == pytest.approx(0.5)
    assert compute_metrics(RECORDS, 2.0, {"e2el": 400}).request_goodput == pytest.approx(1.5)
    assert compute_metrics(RECORDS, 2.0, {"e2el": 100}).request_goodput == 0.0


def test_peak_concurrency_and_output_rate():
    figures = compute_metrics(RECORDS, 2.0)
    # In flight: [0, .16], [.5, .85], [1, 1.2] and the failed [1.1, 1.6], which overlap.
    assert figures.max_concurrent_requests == 2
    # Output of successful requests lands at .1 .12 .14 .16 .8 .85 (second 0) and 1.2 (second 1).
    assert figures.max_output_tokens_per_s == 6.0


def test_an_all_failed_run_reports_zeros_not_errors():
    figures = compute_metrics([record(0.1, [], 1, success=False)], 1.0, {"ttft": 100}).to_dict()
    assert figures["completed"] == 0 and figures["failed"] == 1
    assert figures["mean_ttft_ms"] == 0.0 and figures["p99_itl_ms"] == 0.0
    assert figures["request_goodput"] == 0.0


def test_unknown_slo_keys_are_rejected():
    with pytest.raises(BenchConfigError, match="itl"):
        compute_metrics(RECORDS, 1.0, {"itl": 5})
