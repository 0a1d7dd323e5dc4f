"""`pdserve up --device cuda` on a float32 tiny model: greedy completions streamed through the
gateway's gRPC API equal transformers' `generate` (greedy, float32, on the CPU) token for token."""
import signal
import subprocess
import sys

import pytest
import torch

from tests.helpers import free_port, wait_for_endpoints

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPTS = ("The capital of France is", "1 2 3 4 5", "Once upon a time")
MAX_TOKENS = 12
STARTUP_TIMEOUT_S = 150


def transformers_greedy(model_dir: str, prompt: str) -> list[int]:
    from transformers import AutoModelForCausalLM

    from pdserve.protocol.tokenizer import load_tokenizer

    prompt_ids = load_tokenizer(model_dir).encode(prompt)  # as the gateway encodes it
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        output = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
    return output[0, len(prompt_ids):].tolist()


def test_up_on_a_gpu_generates_what_transformers_does(tiny_model):
    from pdserve.generate_client import build_request, stream_generate

    model_dir, grpc_port = tiny_model(dtype="float32"), free_port()
    up = subprocess.Popen([sys.executable, "-m", "pdserve", "up", "--model", model_dir, "--device", "cuda",
                           "--dtype", "float32", "--grpc-port", str(grpc_port), "--http-port", str(free_port()),
                           "--startup-timeout-s", str(STARTUP_TIMEOUT_S)], stdout=subprocess.PIPE, text=True)
    try:
        wait_for_endpoints(up, STARTUP_TIMEOUT_S + 30)
        for prompt in PROMPTS:
            token_ids: list[int] = []
            request = build_request(prompt, chat=False, max_tokens=MAX_TOKENS, temperature=0.0, top_p=None,
                                    top_k=None, seed=None, stop=())
            stream_generate(f"127.0.0.1:{grpc_port}", request, 60.0, lambda chunk: token_ids.extend(chunk.token_ids))
            assert token_ids == transformers_greedy(model_dir, prompt), prompt
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=40)
        except subprocess.TimeoutExpired:
            up.kill()
