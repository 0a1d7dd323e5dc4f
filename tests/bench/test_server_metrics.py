"""Server figures from Prometheus text: counter increases, histogram means, gauge statistics,
KV transfer rates, every `pdserve:`/`vllm:` series collected without knowing its name."""
import pytest

from pdserve.bench.server_metrics import parse_exposition, summarise


def exposition(*, requests, kv_bytes, kv_count, kv_sum, usage, preemptions):
    # As prometheus_client writes it: a counter's TYPE line names its _total series.
    return f"""\
# TYPE pdserve:request_success_total counter
pdserve:request_success_total{{finished_reason="length",model_name="m"}} {requests}
# TYPE pdserve:request_success_created gauge
pdserve:request_success_created{{finished_reason="length",model_name="m"}} 1.7e9
# TYPE pdserve:kv_transfer_bytes_total counter
pdserve:kv_transfer_bytes_total{{model_name="m",transport="shm"}} {kv_bytes}
# TYPE pdserve:kv_transfer_seconds histogram
pdserve:kv_transfer_seconds_bucket{{le="+Inf",model_name="m",transport="shm"}} {kv_count}
pdserve:kv_transfer_seconds_count{{model_name="m",transport="shm"}} {kv_count}
pdserve:kv_transfer_seconds_sum{{model_name="m",transport="shm"}} {kv_sum}
# TYPE pdserve:some_future_gauge gauge
pdserve:some_future_gauge{{replica="decode-0"}} {usage}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total {preemptions}
# TYPE python_gc_collections_total counter
python_gc_collections_total{{generation="0"}} 99
"""


def test_counters_histograms_and_gauges_over_a_run():
    before = parse_exposition(exposition(requests=10, kv_bytes=1000, kv_count=2, kv_sum=0.5, usage=0.1,
                                         preemptions=1))
    during = [parse_exposition(exposition(requests=12, kv_bytes=2000, kv_count=3, kv_sum=0.6, usage=0.7,
                                          preemptions=1))]
    after = parse_exposition(exposition(requests=15, kv_bytes=5_000_001_000, kv_count=6, kv_sum=2.5, usage=0.4,
                                        preemptions=4))
    figures = summarise(before, during, after)
    assert figures["counters"] == {
        'pdserve:kv_transfer_bytes_total{model_name="m",transport="shm"}': 5_000_000_000,
        'pdserve:request_success_total{finished_reason="length",model_name="m"}': 5,
        "vllm:num_preemptions_total": 3,
    }  # not python_gc (another prefix), not the _created timestamps
    assert figures["histograms"] == {'pdserve:kv_transfer_seconds{model_name="m",transport="shm"}':
                                     {"count": 4, "sum": 2.0, "mean": 0.5}}
    gauge = figures["gauges"]['pdserve:some_future_gauge{replica="decode-0"}']
    assert gauge == pytest.approx({"mean": 0.4, "max": 0.7, "last": 0.4})
    kv = figures["kv_transfer"]
    assert kv["bytes"] == 5_000_000_000 and kv["num_transfers"] == 4
    assert kv["gb_per_s"] == pytest.approx(2.5)  # 5 GB in 2 s of transfers
    assert kv["bytes_per_transfer"] == pytest.approx(1.25e9)
    assert list(kv["by_series"]) == ['{model_name="m",transport="shm"}']


def test_a_server_without_kv_transfers_has_no_kv_figures():
    text = "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.25\n"
    snapshot = parse_exposition(text)
    figures = summarise(snapshot, [], snapshot)
    assert figures["kv_transfer"] is None
    assert figures["gauges"] == {"vllm:kv_cache_usage_perc": {"mean": 0.25, "max": 0.25, "last": 0.25}}


@pytest.mark.parametrize("prefix", ["pdserve:", "vllm:"])
def test_the_prefix_cache_hit_rate_is_hit_over_queried_tokens_during_the_run(prefix):
    def snapshot(queries: int, hits: int):
        return parse_exposition(f"# TYPE {prefix}prefix_cache_queries_total counter\n"
                                f"{prefix}prefix_cache_queries_total{{model_name=\"m\"}} {queries}\n"
                                f"# TYPE {prefix}prefix_cache_hits_total counter\n"
                                f"{prefix}prefix_cache_hits_total{{model_name=\"m\"}} {hits}\n")

    figures = summarise(snapshot(100, 10), [], snapshot(1100, 760))
    assert figures["prefix_cache"] == {"queried_tokens": 1000, "hit_tokens": 750, "hit_rate": 0.75, "by_role": {}}


def test_pdserve_prefix_cache_figures_come_per_role_too():
    def snapshot(decode_hits: int):
        return parse_exposition(
            "# TYPE pdserve:prefix_cache_queries_total counter\n"
            'pdserve:prefix_cache_queries_total{model_name="m",role="prefill"} 400\n'
            'pdserve:prefix_cache_queries_total{model_name="m",role="decode"} 400\n'
            "# TYPE pdserve:prefix_cache_hits_total counter\n"
            'pdserve:prefix_cache_hits_total{model_name="m",role="prefill"} 300\n'
            f'pdserve:prefix_cache_hits_total{{model_name="m",role="decode"}} {decode_hits}\n')

    figures = summarise(parse_exposition(""), [], snapshot(100))["prefix_cache"]
    assert figures["hit_rate"] == 0.5
    assert figures["by_role"]["prefill"]["hit_rate"] == 0.75 and figures["by_role"]["decode"]["hit_rate"] == 0.25
    assert summarise(parse_exposition(""), [], parse_exposition(""))["prefix_cache"] is None
