"""The goals table says what the result files say: a ratio within one run, met or not against its
target, and "not run" (never a pass) where a run or a system is missing."""
import json

from pdserve.bench.goals import CHECKS, markdown, read_results


def system(output_throughput, p99_ttft_ms, p99_itl_ms=10.0, request_goodput=1.0, status="ok"):
    return {"status": status, "result": {"output_throughput": output_throughput, "p99_ttft_ms": p99_ttft_ms,
                                         "p99_itl_ms": p99_itl_ms, "request_goodput": request_goodput}}


def write_run(results_dir, name, systems, slos=None):
    (results_dir / name).mkdir(parents=True)
    run = {"systems": systems, "workload": {"goodput_slos_ms": slos or {}}}
    (results_dir / name / "compare.json").write_text(json.dumps(run))


def rows_by_run(results_dir):
    results = read_results(results_dir)
    return {(row.goal.split(" ")[0], row.run): row for row in (check(results) for check in CHECKS)}


def test_ratios_within_a_run_against_their_targets(tmp_path):
    write_run(tmp_path, "saturation", {"colocated": system(1300, 90), "vllm": system(1000, 100),
                                       "disaggregated": system(1200, 140)})
    write_run(tmp_path, "saturation_bf16", {"colocated": system(1100, 90), "vllm": system(1000, 100),
                                            "disaggregated": system(800, 100)})
    rows = rows_by_run(tmp_path)
    assert rows["colocated", "saturation"].measured == "output tok/s 1.30x, p99 TTFT 0.90x"
    assert rows["colocated", "saturation"].met is True
    assert rows["colocated", "saturation_bf16"].met is False  # 1.10x < 1.2x
    assert rows["disaggregated", "saturation"].met is False  # TTFT 1.56x > 1.5x
    assert rows["disaggregated", "saturation_bf16"].measured == "output tok/s 0.73x, p99 TTFT 1.11x"


def test_missing_runs_and_failed_systems_are_not_run_never_met(tmp_path):
    write_run(tmp_path, "saturation", {"colocated": system(1300, 90), "vllm": system(0, 0, status="failed")})
    rows = rows_by_run(tmp_path)
    assert (rows["colocated", "saturation"].measured, rows["colocated", "saturation"].met) == ("not run", None)
    assert rows["colocated", "prompt_heavy_fp32"].met is None
    assert rows["shm", "kv_transfer"].met is None
    assert "| not run | — |" in markdown(list(rows.values()))


def test_itl_goodput_and_transfer_rows(tmp_path):
    write_run(tmp_path, "mixed_two_cores", {"colocated": system(100, 50, p99_itl_ms=20),
                                            "disaggregated": system(100, 60, p99_itl_ms=8)})
    write_run(tmp_path, "heavy_tailed", {"colocated": system(1, 1, request_goodput=9.0),
                                         "static": system(1, 1, request_goodput=3.0)}, slos={"ttft": 1000, "tpot": 50})
    (tmp_path / "kv_transfer.json").write_text(json.dumps({"rows": [
        {"path": "torch copy_ (contiguous)", "gb_per_s": 10.0},
        {"path": "kvtransfer TRANSPORT_SHM", "gb_per_s": 4.0},
        {"path": "kvtransfer TRANSPORT_GRPC", "gb_per_s": 1.5}]}))
    rows = rows_by_run(tmp_path)
    assert (rows["disaggregated", "mixed_two_cores"].measured, rows["disaggregated", "mixed_two_cores"].met) == (
        "p99 ITL 0.40x", True)
    assert rows["continuous", "heavy_tailed"].measured == (
        "goodput 3.00x, 9.00 vs 3.00 req/s (ttft ≤ 1000 ms, tpot ≤ 50 ms)")
    assert rows["continuous", "heavy_tailed"].met is True
    assert (rows["shm", "kv_transfer"].measured, rows["shm", "kv_transfer"].met) == ("4.00 GB/s, 0.40x", False)
    assert rows["grpc", "kv_transfer"].met is True


def test_a_static_goodput_of_zero_is_met_by_any_continuous_goodput(tmp_path):
    write_run(tmp_path, "heavy_tailed", {"colocated": system(1, 1, request_goodput=2.0),
                                         "static": system(1, 1, request_goodput=0.0)}, slos={"ttft": 1000})
    row = rows_by_run(tmp_path)["continuous", "heavy_tailed"]
    assert (row.measured, row.met) == ("goodput 2.00 vs 0.00 req/s (ttft ≤ 1000 ms)", True)


def test_prefix_caching_rows(tmp_path):
    def cached(median_ttft_ms, p99_ttft_ms, output_throughput=100.0, decode_hit_rate=None):
        entry = system(output_throughput, p99_ttft_ms)
        entry["result"]["median_ttft_ms"] = median_ttft_ms
        if decode_hit_rate is not None:
            entry["result"]["server"] = {"prefix_cache": {"by_role": {"decode": {"hit_rate": decode_hit_rate}}}}
        return entry

    write_run(tmp_path, "shared_prefix", {"colocated": cached(20, 50, 130), "colocated-nocache": cached(100, 200),
                                          "vllm": cached(30, 60, 100)})
    write_run(tmp_path, "prefix_routing", {"disaggregated": cached(1, 1, decode_hit_rate=0.8),
                                           "disaggregated-load": cached(1, 1, decode_hit_rate=0.5)})
    results = read_results(tmp_path)
    rows = {(row.goal.split(":")[1].split(",")[0].strip(), row.run): row for row in (check(results) for check in CHECKS)
            if row.goal.startswith(("prefix caching", "cache-aware"))}
    ttft = rows["TTFT ≤ 0.3x without", "shared_prefix"]
    assert (ttft.measured, ttft.met) == ("p50 TTFT 0.20x, p99 0.25x", True)
    versus_vllm = rows["colocated ≥ 1.2x vLLM output tok/s", "shared_prefix"]
    assert (versus_vllm.measured, versus_vllm.met) == ("output tok/s 1.30x, p99 TTFT 0.83x", True)
    assert rows["TTFT ≤ 0.3x without", "multi_turn"].met is None
    routing = rows["decode hit rate against load-only routing's", "prefix_routing"]
    assert (routing.measured, routing.met) == ("decode hit rate 80.0% vs 50.0%", None)
