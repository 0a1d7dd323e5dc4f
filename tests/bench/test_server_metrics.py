"""Server figures from Prometheus text, scraped before and after a run: counter increases,
histogram means and gauges after the run of every `pdserve:`/`vllm:` series, collected without
knowing its name."""
from pdserve.bench.server_metrics import parse_exposition, server_section, summarise


def exposition(*, requests, kv_count, kv_sum, preemptions, resident_bytes=0):
    # As prometheus_client writes it: a counter's TYPE line names its _total series.
    return f"""\
# TYPE pdserve:request_success_total counter
pdserve:request_success_total{{finished_reason="length",model_name="m"}} {requests}
# TYPE pdserve:request_success_created gauge
pdserve:request_success_created{{finished_reason="length",model_name="m"}} 1.7e9
# TYPE pdserve:kv_transfer_seconds histogram
pdserve:kv_transfer_seconds_bucket{{le="+Inf",model_name="m",transport="shm"}} {kv_count}
pdserve:kv_transfer_seconds_count{{model_name="m",transport="shm"}} {kv_count}
pdserve:kv_transfer_seconds_sum{{model_name="m",transport="shm"}} {kv_sum}
# TYPE pdserve:replica_resident_memory_bytes gauge
pdserve:replica_resident_memory_bytes{{kind="decode",replica="d0"}} {resident_bytes}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total {preemptions}
# TYPE python_gc_collections_total counter
python_gc_collections_total{{generation="0"}} 99
"""


def test_counter_increases_histogram_means_and_gauges_over_a_run():
    before = parse_exposition(exposition(requests=10, kv_count=2, kv_sum=0.5, preemptions=1, resident_bytes=400))
    after = parse_exposition(exposition(requests=15, kv_count=6, kv_sum=2.5, preemptions=4, resident_bytes=500))
    figures = summarise(before, after)
    assert figures["counters"] == {
        'pdserve:request_success_total{finished_reason="length",model_name="m"}': 5,
        "vllm:num_preemptions_total": 3,
    }  # not python_gc (another prefix), not the _created timestamps
    assert figures["histograms"] == {'pdserve:kv_transfer_seconds{model_name="m",transport="shm"}':
                                     {"count": 4, "sum": 2.0, "mean": 0.5}}
    assert figures["gauges"] == {'pdserve:replica_resident_memory_bytes{kind="decode",replica="d0"}': 500}
    assert figures["gauge_changes"] == {'pdserve:replica_resident_memory_bytes{kind="decode",replica="d0"}': 100}


def test_a_gauge_that_appeared_during_the_run_has_no_change():
    before = parse_exposition("")
    after = parse_exposition(exposition(requests=1, kv_count=0, kv_sum=0, preemptions=0, resident_bytes=500))
    assert summarise(before, after)["gauge_changes"] == {}


def test_a_histogram_with_nothing_observed_during_the_run_has_no_mean():
    snapshot = parse_exposition(exposition(requests=1, kv_count=2, kv_sum=0.5, preemptions=0))
    assert summarise(snapshot, snapshot)["histograms"]['pdserve:kv_transfer_seconds{model_name="m",transport="shm"}'] \
        == {"count": 0, "sum": 0, "mean": None}


def test_a_failed_scrape_is_recorded_instead_of_the_figures():
    snapshot = parse_exposition("")
    section = server_section("http://h/metrics", snapshot, "ClientConnectorError: refused")
    assert section == {"metrics_url": "http://h/metrics", "scrape_errors": ["ClientConnectorError: refused"]}
    assert server_section("http://h/metrics", snapshot, snapshot)["counters"] == {}
