"""Clients of the gateway's public fronts as a caller with (or without) an API key sees them:
gRPC over plaintext or TLS, HTTP(S) with the stdlib, a Prometheus scrape, a self-signed
certificate made with the openssl CLI, a `pdserve serve` process, and the offline engine's
greedy output as the reference every front must give."""
from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.system.faults.conftest import greedy_request  # noqa: F401  (for the tests)
from tests.helpers import ENGINE_FLAGS, ENGINE_OPTIONS
from tests.helpers import free_port, wait_until  # noqa: F401  (also for the tests)

START_DEADLINE_S = 180.0


def bearer(key: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata that presents `key` (none for None)."""
    return (("authorization", f"Bearer {key}"),) if key is not None else ()


@dataclass(frozen=True)
class Greedy:
    token_ids: list[int]
    text: str


def offline_greedy(model_dir: str, prompts: list[list[int]], max_tokens: int) -> list[Greedy]:
    """The offline engine's greedy output for each prompt (EOS ignored): what every front must give."""
    from pdserve.engine import LLM, SamplingParams

    llm = LLM(model_dir, **ENGINE_OPTIONS)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                           use_tqdm=False)
    return [Greedy(list(output.outputs[0].token_ids), output.outputs[0].text) for output in outputs]


@dataclass(frozen=True)
class Certificate:
    cert_path: Path
    key_path: Path

    @property
    def pem(self) -> bytes:
        return self.cert_path.read_bytes()

    def client_context(self) -> ssl.SSLContext:
        """An HTTPS client context that trusts this certificate only."""
        return ssl.create_default_context(cafile=str(self.cert_path))


def self_signed_certificate(directory: Path) -> Certificate:
    """A fresh key and a certificate for 127.0.0.1 and localhost, its own CA."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return Certificate(cert, key)


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: dict[str, str]
    text: str

    def json(self):
        return json.loads(self.text)


def http(url: str, body: object | None = None, key: str | None = None,
         context: ssl.SSLContext | None = None, timeout_s: float = 60.0) -> HttpAnswer:
    """One request (POST with a JSON body, else GET); error statuses are returned, not raised."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return HttpAnswer(response.status, dict(response.headers), response.read().decode())
    except urllib.error.HTTPError as error:
        with error:
            return HttpAnswer(error.code, dict(error.headers), error.read().decode())


def completion_body(prompt_ids: list[int], max_tokens: int, stream: bool = False) -> dict:
    return {"model": "model0", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def scrape(url: str, context: ssl.SSLContext | None = None) -> dict[str, float]:
    """A /metrics page as {sample name{labels}: value}; labels in sorted order."""
    answer = http(url, context=context, timeout_s=10)
    assert answer.status == 200, answer
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            labels = ",".join(f'{name}="{value}"' for name, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    return sum(value for key, value in samples.items()
               if key.split("{", 1)[0] == name and all(w in key for w in wanted))


@dataclass
class ServeProcess:
    """`pdserve serve` in its own process, on a free port."""
    process: subprocess.Popen
    base_url: str  # http(s)://127.0.0.1:<port>
    log_path: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def start_serve(model_dir: str, work_dir: Path, *flags: str, context: ssl.SSLContext | None = None) -> ServeProcess:
    port = free_port()
    scheme = "https" if context is not None else "http"
    log_path = work_dir / "serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "pdserve", "serve", "--model", model_dir,
                                    "--port", str(port), *ENGINE_FLAGS, *flags],
                                   stdout=log, stderr=subprocess.STDOUT)
    served = ServeProcess(process, f"{scheme}://127.0.0.1:{port}", log_path)

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"pdserve serve exited:\n{log_path.read_text()[-3000:]}")
        try:
            return http(served.base_url + "/health", context=context, timeout_s=1).status == 200
        except OSError:
            return False

    try:
        wait_until(healthy, "pdserve serve to answer /health", START_DEADLINE_S)
    except BaseException:
        served.stop()
        raise
    return served


def grpc_code(error: BaseException) -> grpc.StatusCode | None:
    return error.code() if isinstance(error, grpc.RpcError) else None
