"""A serve run's markdown summary and plot, from results built out of synthetic records."""
import json
import math

from pdserve.bench.metrics import compute_metrics
from pdserve.bench.records import RequestRecord
from pdserve.bench.report_serve import render_markdown, write_report
from pdserve.bench.runner import BenchConfig, BenchResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def result(request_rate, slos=None):
    records = [
        RequestRecord(prompt_len=8, output_len=3, ttft_s=0.05, itl_s=[0.01, 0.02], e2el_s=0.08, success=True, error=""),
        RequestRecord(prompt_len=8, output_len=0, ttft_s=0.0, itl_s=[], e2el_s=0.01, success=False,
                      error="BackendError: HTTP 400: a | b\nc"),
    ]
    config = BenchConfig(target="http://h:1/v1", request_rate=request_rate,
                         goodput_slos_ms=slos or {}, label=f"t_rate{request_rate:g}")
    return BenchResult(config=config, model_id="m", date="2026-01-01T00:00:00+00:00", records=records,
                       metrics=compute_metrics(records, 1.0, config.goodput_slos_ms), server=None)


def test_markdown_has_the_run_table_the_latency_table_and_escaped_errors():
    text = render_markdown(result(2.0, {"ttft": 100}).to_json_dict())
    assert "## Serving Benchmark Result: t_rate2" in text
    assert "| Successful requests | 1 |" in text and "| Failed requests | 1 |" in text
    assert "| Request goodput (req/s) | 1.00 |" in text
    assert "| TTFT | 50.00 | 50.00 | 0.00 | 50.00 | 50.00 |" in text
    assert "| BackendError: HTTP 400: a \\| b c | 1 |" in text  # one table cell


def test_without_slos_there_is_no_goodput_row():
    assert "goodput" not in render_markdown(result(math.inf).to_json_dict())


def test_the_report_writes_markdown_and_a_cdf_beside_the_json(tmp_path):
    figures = result(2.0).to_json_dict()
    path = tmp_path / "t_rate2.json"
    path.write_text(json.dumps(figures))
    markdown = write_report(figures, path)
    assert (tmp_path / "t_rate2.md").read_text() == markdown == render_markdown(figures)
    assert (tmp_path / "t_rate2_latency_cdf.png").read_bytes().startswith(PNG_MAGIC)
