"""bench.engine_time: each pdserve engine's steps over a run, from the change of its gauges."""
import pytest

from pdserve.bench.engine_time import busy_text, engine_time


def test_engines_are_read_from_the_gauges_changes_and_other_series_ignored():
    changes = {
        'pdserve:replica_engine_step_seconds{kind="decode",replica="decode-0",step="decode"}': 12.0,
        'pdserve:replica_engine_step_seconds{kind="decode",replica="decode-0",step="mixed"}': 15.0,
        'pdserve:replica_engine_steps{kind="decode",replica="decode-0",step="mixed"}': 200.0,
        'pdserve:replica_computed_tokens{kind="decode",replica="decode-0",phase="prompt"}': 6000.0,
        'pdserve:replica_computed_tokens{kind="decode",replica="decode-0",phase="decode"}': 9000.0,
        'pdserve:replica_engine_step_seconds{kind="prefill",replica="prefill-0",step="prompt"}': 28.5,
        'pdserve:replica_resident_memory_bytes{kind="decode",replica="decode-0"}': 1e6,
        "vllm:num_requests_running": 3.0,
    }
    engines = engine_time({"gauge_changes": changes})
    assert list(engines) == ["decode-0", "prefill-0"]
    decode = engines["decode-0"]
    assert decode["busy_s"] == {"decode": 12.0, "mixed": 15.0, "prompt": 0.0}
    assert decode["steps"] == {"decode": 0, "mixed": 200, "prompt": 0}
    assert (decode["prompt_tokens"], decode["decode_tokens"]) == (6000, 9000)
    assert engines["prefill-0"]["busy_s"]["prompt"] == pytest.approx(28.5)
    assert busy_text(engines, 30.0) == "decode-0 90% (decode 40, mixed 50); prefill-0 95% (prompt 95)"


def test_serves_one_engine_is_named_engine_and_a_peer_has_none():
    key = 'pdserve:replica_engine_step_seconds{kind="engine",replica="",step="mixed"}'
    assert list(engine_time({"gauge_changes": {key: 1.0}})) == ["engine"]
    assert engine_time({"gauge_changes": {"vllm:num_requests_running": 1.0}}) == {}
    assert engine_time(None) == engine_time({"scrape_errors": ["refused"]}) == {}
