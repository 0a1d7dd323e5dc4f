"""`pdserve bench serve` end to end, against a running `pdserve serve` and against a system it
starts itself (over OpenAI HTTP, and over the gateway's gRPC API): the result files exist, the
JSON has vLLM's fields, every request completed with the tokens it asked for, and the server's
own counters agree. Nothing here is about speed."""
import json
import subprocess
import sys

import pytest

from pdserve.bench.datasets import make_dataset
from pdserve.cli import main as pdserve_main
from tests.helpers import ENGINE_FLAGS, free_port, wait_for_health

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 120.0
BENCH_TIMEOUT_S = 120.0
VLLM_FIELDS = (
    "completed", "failed", "total_input_tokens", "total_output_tokens", "duration", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
    "itls", "errors",
    *(f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
      for stat in ("mean", "median", "std", "p90", "p99")),
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    model_dir = tiny_model()
    port = free_port()
    with open(tmp_path_factory.mktemp("serve") / "serve.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "pdserve", "serve", "--model", model_dir,
                                    "--port", str(port), *ENGINE_FLAGS], stdout=log, stderr=subprocess.STDOUT)
    wait_for_health(process, f"http://127.0.0.1:{port}/health", START_TIMEOUT_S)
    yield model_dir, f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=20)


def bench(*flags):
    result = subprocess.run([sys.executable, "-m", "pdserve", "bench", "serve", "--disable-tqdm",
                             *flags], capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_one_run_writes_vllm_shaped_results(server, tmp_path):
    model_dir, url = server
    dataset = dict(num_prompts=6, seed=4, input_len=16, output_len=6, range_ratio=0.3)
    stdout = bench("--target", f"{url}/v1", "--tokenizer", model_dir, "--dataset", "random",
                   "--num-prompts", "6", "--seed", "4", "--input-len", "16", "--output-len", "6",
                   "--range-ratio", "0.3", "--request-rate", "20", "--goodput", "ttft:600000", "e2el:600000",
                   "--metrics-url", f"{url}/metrics", "--result-dir", str(tmp_path), "--label", "smoke")
    assert "Serving Benchmark Result: smoke" in stdout
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert set(VLLM_FIELDS) <= set(result)
    assert result["completed"] == 6 and result["failed"] == 0 and result["errors"] == [""] * 6
    assert result["request_goodput"] == pytest.approx(6 / result["duration"])  # SLOs no run can miss
    # Lengths depend on the seed only, not on which ids fill them: no tokenizer needed to know them.
    expected = make_dataset("random", vocab_size=1000, **dataset)
    assert result["input_lens"] == [len(request.prompt_token_ids) for request in expected]
    assert result["output_lens"] == [request.output_len for request in expected]  # ignore_eos: all of them
    # A token that ends mid-character streams no text of its own, so gaps <= tokens - 1.
    assert all(len(gaps) <= n - 1 for gaps, n in zip(result["itls"], result["output_lens"]))
    counters = result["server"]["counters"]
    generated = [value for key, value in counters.items() if key.startswith("pdserve:generation_tokens_total")]
    assert generated == [result["total_output_tokens"]]
    assert (tmp_path / "smoke.md").read_text() in stdout
    assert (tmp_path / "smoke_latency_cdf.png").read_bytes().startswith(PNG_MAGIC)


def test_a_system_started_by_the_bench_is_measured_and_stopped(tiny_model, tmp_path, capsys):
    status = pdserve_main(["bench", "serve", "--system", "colocated", "--model", tiny_model(), *ENGINE_FLAGS,
                           "--num-prompts", "4",
                           "--input-len", "8", "--output-len", "3", "--max-concurrency", "2", "--label", "started",
                           "--result-dir", str(tmp_path), "--disable-tqdm"])
    assert status == 0
    run = json.loads((tmp_path / "started.json").read_text())
    assert (run["completed"], run["max_concurrency"]) == (4, 2) and 1 <= run["max_concurrent_requests"] <= 2
    assert run["server"]["counters"]  # its /metrics, scraped without being named
    assert "Serving Benchmark Result: started" in capsys.readouterr().out
    assert (tmp_path / "started_latency_cdf.png").read_bytes().startswith(PNG_MAGIC)


def test_the_grpc_backend_measures_the_gateway_of_a_started_pdserve_up(tiny_model, tmp_path):
    status = pdserve_main(["bench", "serve", "--backend", "grpc", "--system", "disaggregated", "--model", tiny_model(),
                           *ENGINE_FLAGS,
                           "--num-prompts", "3", "--input-len", "8", "--output-len", "3", "--label", "grpc",
                           "--result-dir", str(tmp_path), "--disable-tqdm"])
    assert status == 0
    run = json.loads((tmp_path / "grpc.json").read_text())
    assert (run["backend"], run["completed"], run["output_lens"]) == ("grpc", 3, [3, 3, 3])
    assert run["server"]["requests"]["states"] == {"finished": 3}  # GetRequest, after the run
