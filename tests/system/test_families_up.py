"""Every family through the whole system: `pdserve up --model DIR` on a tiny random checkpoint of
it (one prefill and one decode replica, KV moved over shared memory) answers greedy completions
over the OpenAI HTTP API as transformers' greedy `generate` does: the same text, the same text
token by token, and each token's logprob.

Prompts go in as token ids, a batch of three in one request. The prefill replica samples each
answer's first token, the decode replica the rest from the KV it received. For the windowed
families the two long prompts exceed every window, so the KV that moves reaches past it, and the
short prompt's answer crosses the window's edge while decoding.
"""
import os
import signal
import subprocess
import sys

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.family_configs import (
    PHI3_ORIGINAL_CONTEXT,
    QWEN3_MOE_LAYOUTS,
    VOCAB_SIZE,
    gemma2_config,
    gemma3_config,
    llama_config,
    mistral_config,
    mixtral_config,
    phi3_longrope_config,
    qwen2_sliding_config,
    qwen3_moe_config,
    qwen3_sliding_config,
)
from tests.helpers import ENGINE_FLAGS, free_port, wait_for_endpoints

pytestmark = pytest.mark.e2e

STARTUP_DEADLINE_S = 120.0
REQUEST_TIMEOUT_S = 60.0
SHUTDOWN_DEADLINE_S = 40.0  # up's own 15 s grace, plus exit and reaping
MAX_TOKENS = 12  # the 5-token prompt's answer ends 16 positions in, past every window (10 to 12)
PROMPT_LENGTHS = (5, 40, 70)
LOGPROB_TOL = 1e-4  # float32 on both sides, as tests/engine/test_families.py compares them

FAMILIES = [
    pytest.param(llama_config, PROMPT_LENGTHS, id="llama"),
    pytest.param(mistral_config, PROMPT_LENGTHS, id="mistral"),
    pytest.param(qwen2_sliding_config, PROMPT_LENGTHS, id="qwen2"),
    pytest.param(qwen3_sliding_config, PROMPT_LENGTHS, id="qwen3"),
    # Within its original context transformers rotates with the short factors, while a server
    # (whose context is longer) always takes the long ones: every prompt here is longer.
    pytest.param(phi3_longrope_config, (PHI3_ORIGINAL_CONTEXT + 1, 40, 70), id="phi3_longrope"),
    pytest.param(gemma2_config, PROMPT_LENGTHS, id="gemma2"),
    pytest.param(gemma3_config, PROMPT_LENGTHS, id="gemma3"),
    pytest.param(mixtral_config, PROMPT_LENGTHS, id="mixtral"),
    pytest.param(lambda: qwen3_moe_config(**QWEN3_MOE_LAYOUTS[0]), PROMPT_LENGTHS, id="qwen3_moe"),
]


@pytest.fixture
def up(tmp_path):
    """Starts `pdserve up` on a model folder and returns its OpenAI base URL; after the test, Ctrl-C
    stops it (and, past the deadline, SIGKILL its process group, which holds only what it started)."""
    started = []

    def start(model_dir: str) -> str:
        http_port = free_port()
        environ = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
        with (tmp_path / "up.log").open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "pdserve", "up", "--model", model_dir, "--prefill", "1", "--decode", "1",
                 *ENGINE_FLAGS, "--transport", "shm", "--grpc-port", str(free_port()),
                 "--http-port", str(http_port),
                 "--startup-timeout-s", str(STARTUP_DEADLINE_S)],
                stdout=subprocess.PIPE, stderr=log, text=True, env=environ, start_new_session=True)
        started.append(process)
        wait_for_endpoints(process, STARTUP_DEADLINE_S + 10)
        return f"http://127.0.0.1:{http_port}/v1"

    yield start
    for process in started:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=SHUTDOWN_DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=SHUTDOWN_DEADLINE_S)
    print((tmp_path / "up.log").read_text()[-20000:])


def random_prompts(lengths) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist() for n in lengths]


def transformers_logprobs(model_dir: str, prompts, answers) -> list[list[float]]:
    """Each answer token's log-probability under transformers, teacher-forced."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    logprobs = []
    for prompt, answer in zip(prompts, answers):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1:-1]  # [len(answer), vocab]
        logprobs.append(logits.log_softmax(dim=-1)[torch.arange(len(answer)), answer].tolist())
    return logprobs


@pytest.mark.parametrize("make_config, prompt_lengths", FAMILIES)
def test_up_serves_transformers_greedy_answers(up, hf_model, hf_greedy, make_config, prompt_lengths):
    model_dir = hf_model(make_config())
    client = openai.OpenAI(base_url=up(model_dir), api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)
    prompts = random_prompts(prompt_lengths)

    completion = client.completions.create(
        model=client.models.list().data[0].id, prompt=prompts, max_tokens=MAX_TOKENS, temperature=0.0,
        logprobs=0, extra_body={"ignore_eos": True})

    answers = hf_greedy(model_dir, [(prompt, MAX_TOKENS) for prompt in prompts])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    choices = sorted(completion.choices, key=lambda choice: choice.index)
    assert [choice.finish_reason for choice in choices] == ["length"] * len(prompts)
    served = [(choice.text, choice.logprobs.tokens) for choice in choices]
    expected = [(tokenizer.decode(answer, skip_special_tokens=True, clean_up_tokenization_spaces=False),
                 [tokenizer.decode([token_id]) for token_id in answer]) for answer in answers]
    assert served == expected
    torch.testing.assert_close(torch.tensor([choice.logprobs.token_logprobs for choice in choices]),
                               torch.tensor(transformers_logprobs(model_dir, prompts, answers)),
                               rtol=0, atol=LOGPROB_TOL)
