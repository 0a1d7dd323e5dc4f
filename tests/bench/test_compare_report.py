"""The bench-compare report from a hand-made run: goodput under the stated SLOs, and its ratio."""
import pytest

from pdserve.bench.compare_report import markdown, ratios
from pdserve.bench.metrics import compute_metrics
from pdserve.bench.records import RequestRecord
from pdserve.bench.runner import BenchConfig, BenchResult

SLOS_MS = {"ttft": 1000.0, "tpot": 50.0}


def record(ttft_s: float, itl_s: list[float]) -> RequestRecord:
    return RequestRecord(prompt_len=8, output_len=len(itl_s) + 1, ttft_s=ttft_s, itl_s=itl_s,
                         e2el_s=ttft_s + sum(itl_s), success=True, error="")


# static: tokens in one burst (TPOT 0); only the 0.4 s TTFT meets the TTFT SLO. 1 good in 2 s.
STATIC = [record(1.5, [0.0, 0.0]), record(1.5, [0.0, 0.0]), record(1.6, [0.0, 0.0]), record(0.4, [0.0, 0.0])]
# colocated: TPOTs 20, 20, 80, 20 ms and TTFTs 0.2, 0.3, 0.3, 1.2 s: the first two meet both. 2 good in 1 s.
COLOCATED = [record(0.2, [0.02, 0.02]), record(0.3, [0.02, 0.02]), record(0.3, [0.08, 0.08]),
             record(1.2, [0.02, 0.02])]


def system_result(records: list[RequestRecord], duration_s: float, slos_ms: dict) -> dict:
    config = BenchConfig(backend="openai", target="http://h:1/v1", goodput_slos_ms=slos_ms)
    return BenchResult(config=config, model_id="m", date="2026-01-01T00:00:00+00:00", records=records,
                       metrics=compute_metrics(records, duration_s, slos_ms), server=None).to_json_dict()


def combined(slos_ms: dict) -> dict:
    return {
        "date": "2026-01-01T00:00:00+00:00", "command": ["pdserve", "bench-compare"],
        "model": {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 4,
                  "vocab_size": 4096},
        "workload": {"dataset": "heavy-tailed", "num_prompts": 4, "input_len": 8, "output_len": 3,
                     "request_rate": "inf", "max_concurrency": 4, "seed": 0, "dtype": "bfloat16",
                     "goodput_slos_ms": slos_ms,
                     "input_lens": {"min": 8, "median": 8.0, "mean": 8.0, "max": 8, "total": 32},
                     "output_lens": {"min": 1, "median": 3.0, "mean": 2.5, "max": 3, "total": 10}},
        "machine": {}, "pinning": {"server_cpus": [1], "server_threads": 1, "client_cpus": [0]},
        "systems": {"static": {"status": "ok", "result": system_result(STATIC, 2.0, slos_ms)},
                    "colocated": {"status": "ok", "result": system_result(COLOCATED, 1.0, slos_ms)},
                    "vllm": {"status": "skipped", "note": "no --peer-vllm script given", "result": None}},
    }


def test_goodput_is_the_rate_of_requests_meeting_every_slo_and_its_ratio_to_static():
    run = combined(SLOS_MS)
    assert run["systems"]["static"]["result"]["request_goodput"] == pytest.approx(0.5)
    assert run["systems"]["colocated"]["result"]["request_goodput"] == pytest.approx(2.0)
    assert ratios(run)["colocated"]["request_goodput/static"] == pytest.approx(4.0)
    text = markdown(run)
    assert "meeting every SLO (TTFT ≤ 1000 ms, TPOT ≤ 50 ms)" in text
    assert "| static | 0.50 | 1 / 4 | — |" in text
    assert "| colocated | 2.00 | 2 / 4 | 4.00x |" in text


def test_without_slos_there_is_no_goodput_table_or_ratio():
    run = combined({})
    assert "request_goodput/static" not in ratios(run)["colocated"]
    assert "goodput" not in markdown(run).lower()


def test_the_workload_line_states_the_real_lengths_and_the_dtype():
    text = markdown(combined(SLOS_MS))
    assert "input 8, output 1–3 (mean 2.5, median 3) tokens (ignore_eos, greedy), bfloat16" in text
    assert "at most 4 in flight" in text


def test_the_hit_rate_column_and_the_no_cache_ratios_appear_when_there_is_something_to_show():
    assert "prefix hit rate" not in markdown(combined({}))
    assert "÷ no prefix cache" not in markdown(combined({}))  # no colocated-nocache system ran

    run = combined({})
    run["systems"]["colocated"]["result"]["server"] = {"prefix_cache": {"hit_rate": 0.8125}}
    assert "decode hit rate" not in markdown(run)
    run["systems"]["colocated-nocache"] = {"status": "ok", "result": system_result(STATIC, 2.0, {})}
    text = markdown(run)
    assert "prefix hit rate" in text and "81.2%" in text
    assert ratios(run)["colocated"]["median_ttft_ms/colocated-nocache"] == pytest.approx(0.3 / 1.5)  # medians of the TTFTs above
    assert "p50 TTFT ÷ no prefix cache" in text

    run["systems"]["colocated"]["result"]["server"]["prefix_cache"]["by_role"] = {"decode": {"hit_rate": 0.5}}
    assert "| decode hit rate |" in markdown(run) and "| 81.2% | 50.0% |" in markdown(run)


def test_a_run_of_systems_no_ratio_refers_to_has_no_ratio_table():
    run = combined({})
    run["systems"] = {"disaggregated": run["systems"]["colocated"]}
    assert "÷" not in markdown(run)
