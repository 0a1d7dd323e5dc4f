"""`pdserve up` on a tiny model: greedy output through the gateway equals transformers'.

Writes a float32 tiny model, starts `pdserve up --device DEVICE --dtype float32` with its own
Redis, streams greedy completions of a few prompts through the gateway's gRPC API, and compares
each with `transformers` `generate` (greedy, float32, on the CPU) token for token. Exits non-zero
on any difference, and stops `up` (SIGINT) either way.

    python scripts/gpu_up_check.py --device cuda --prefill 1 --decode 1
    python scripts/gpu_up_check.py --device cpu     # the script itself, where no GPU is at hand
"""
from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROMPTS = ("The capital of France is", "1 2 3 4 5", "Once upon a time")
MAX_TOKENS = 12


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prefill", type=int, default=1)
    parser.add_argument("--decode", type=int, default=1)
    parser.add_argument("--startup-timeout-s", type=float, default=150.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pdserve-up-check-") as tmp:
        from pdserve.checkpoints.tiny.model import write_tiny_model

        model_dir = write_tiny_model(Path(tmp) / "tiny", dtype="float32")
        expected = [transformers_greedy(model_dir, prompt) for prompt in PROMPTS]
        got = served_greedy(model_dir, args)
    failures = 0
    for prompt, want, have in zip(PROMPTS, expected, got):
        same = want == have
        failures += not same
        print(f"{'ok  ' if same else 'DIFF'} {prompt!r}: transformers {want} pdserve {have}")
    return 1 if failures else 0


def transformers_greedy(model_dir: Path, prompt: str) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    from pdserve.protocol.tokenizer import load_tokenizer

    prompt_ids = load_tokenizer(model_dir).encode(prompt)  # as the gateway encodes it
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        output = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
    return output[0, len(prompt_ids):].tolist()


def served_greedy(model_dir: Path, args: argparse.Namespace) -> list[list[int]]:
    from pdserve.generate_client import build_request, stream_generate

    grpc_port, http_port = free_port(), free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "pdserve", "up", "--model", str(model_dir), "--device", args.device,
         "--dtype", "float32", "--prefill", str(args.prefill), "--decode", str(args.decode),
         "--grpc-port", str(grpc_port), "--http-port", str(http_port),
         "--startup-timeout-s", str(args.startup_timeout_s)],
        stdout=subprocess.PIPE, text=True)
    try:
        wait_until_up(up, args.startup_timeout_s + 30)
        results = []
        for prompt in PROMPTS:
            token_ids: list[int] = []
            request = build_request(prompt, chat=False, max_tokens=MAX_TOKENS, temperature=0.0,
                                    top_p=None, top_k=None, seed=None, stop=())
            stream_generate(f"127.0.0.1:{grpc_port}", request, 60.0, lambda chunk: token_ids.extend(chunk.token_ids))
            results.append(token_ids)
        return results
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=40)
        except subprocess.TimeoutExpired:
            up.kill()


def wait_until_up(up: subprocess.Popen, timeout_s: float) -> None:
    """Returns once `up` prints its endpoints; raises if it exits or the time runs out."""
    is_up = threading.Event()

    def read() -> None:
        for line in up.stdout:
            print(line, end="")
            if line.startswith("pdserve is up"):
                is_up.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not is_up.wait(0.5):
        if up.poll() is not None:
            raise RuntimeError(f"pdserve up exited with {up.returncode} before it was up")
        if time.monotonic() > deadline:
            raise RuntimeError(f"pdserve up not up within {timeout_s:.0f} s")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
