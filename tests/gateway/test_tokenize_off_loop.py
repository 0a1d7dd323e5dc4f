"""Tokenizing a long prompt never stalls the gateway's event loop: while the tokenizer works on
a 1 MiB prompt, /health still answers."""
import threading

from pdserve.gateway.front.tokenization import PromptBuilder

PROMPT_CHARS = 2**20
TOKENIZER_DEADLINE_S = 10.0


class GatedTokenizer:
    """One token per character, produced only once `release` is set (or its deadline passes)."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def encode(self, text: str) -> list[int]:
        self.started.set()
        self.release.wait(timeout=TOKENIZER_DEADLINE_S)
        self.finished.set()
        return [1] * len(text)


def test_health_answers_while_a_1_mib_prompt_is_being_tokenized(server, tmp_path):
    tokenizer = GatedTokenizer()
    server.frontend.prompts = PromptBuilder(tokenizer, str(tmp_path), vocab_size=2, max_model_len=2 * PROMPT_CHARS)
    answers = {}
    tokenize = threading.Thread(target=lambda: answers.update(tokenize=server.request(
        "POST", "/tokenize", json_body={"prompt": "x" * PROMPT_CHARS})))
    tokenize.start()
    try:
        assert tokenizer.started.wait(timeout=TOKENIZER_DEADLINE_S)
        health = server.request("GET", "/health")
        # On the loop, encode would hold /health back until its deadline, and finish first.
        assert (health.status, tokenizer.finished.is_set()) == (200, False)
    finally:
        tokenizer.release.set()
        tokenize.join(timeout=TOKENIZER_DEADLINE_S)
    assert answers["tokenize"].status == 200
    assert answers["tokenize"].json()["count"] == PROMPT_CHARS
