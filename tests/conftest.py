"""Test-wide set-up: Triton kernels run under the interpreter unless a GPU run says otherwise.

The interpreter flag must be set before any module that defines a Triton kernel is imported.
tests/tier_check.py reads the tiers from pyproject.toml's markers, gives `pytest --fast` (the fast
tier) and fails a test that starts a pdserve service or a Redis server without a tier marker.
tests/real_redis.py holds the fixtures of the redis tier; process helpers shared between folders
are in tests/helpers.py.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

pytest_plugins = ["tests.tier_check", "tests.real_redis"]


def pytest_configure(config):
    """One torch thread in the test process. Its tensors are tiny, and on a small machine that
    others share a second intra-op thread waiting for a core costs far more than it saves: the
    engine's greedy run in tests/engine takes ~0.7 s on one thread and ~7 s on two when the two
    cores are busy. Processes the tests start choose their own (services: one per pinned CPU)."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Writes a tiny random-weight model folder once per distinct spec and returns its path."""
    from pdserve.checkpoints.tiny.model import write_tiny_model

    written = {}

    def make(**spec) -> str:
        key = tuple(sorted(spec.items()))
        if key not in written:
            written[key] = str(write_tiny_model(tmp_path_factory.mktemp("model"), **spec))
        return written[key]

    return make


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory):
    """Writes a random-weight folder for a transformers config of any architecture, once per
    distinct config, and returns its path: the tiny tokenizer (its special ids set in the config),
    weights drawn as `tiny_model` draws them, saved by the architecture's own model class, so the
    folder holds the checkpoint names users download."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from pdserve.checkpoints.tiny.model import TinyModelSpec, generation_config, random_weights
    from pdserve.checkpoints.tiny.tokenizer import write_tiny_tokenizer

    written = {}

    def make(config, seed: int = 0) -> str:
        key = (config.to_json_string(), seed)
        if key not in written:
            config = copy.deepcopy(config)
            out_dir = tmp_path_factory.mktemp(config.model_type)
            tokenizer = write_tiny_tokenizer(out_dir, config.vocab_size)
            config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
            config.pad_token_id = tokenizer.pad_token_id
            weights = random_weights(config, TinyModelSpec(seed=seed))  # reads the spec's seed, init range, dtype
            model = AutoModelForCausalLM.from_config(config)
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    parameter.copy_(weights[name])
            model.save_pretrained(out_dir)
            generation_config(tokenizer).save_pretrained(out_dir)
            written[key] = str(out_dir)
        return written[key]

    return make


@pytest.fixture(scope="session")
def hf_greedy():
    """The oracle: transformers' greedy `generate` for each (prompt ids, max_tokens), run alone and
    to max_tokens (EOS does not stop it, like `ignore_eos`)."""
    def generate(model_dir: str, cases, dtype: str = "float32") -> list[list[int]]:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        model.generation_config.eos_token_id = None
        outputs = []
        for prompt, max_tokens in cases:
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=0)
            outputs.append(out[0, len(prompt):].tolist())
        return outputs

    return generate
