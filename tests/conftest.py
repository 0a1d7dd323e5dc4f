"""Test-wide set-up: Triton kernels run under the interpreter unless a GPU run says otherwise.

The interpreter flag must be set before any module that defines a Triton kernel is imported.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Writes a tiny random-weight model folder once per distinct spec and returns its path."""
    from pdserve.checkpoints.tiny_model import write_tiny_model

    written = {}

    def make(**spec) -> str:
        key = tuple(sorted(spec.items()))
        if key not in written:
            written[key] = str(write_tiny_model(tmp_path_factory.mktemp("model"), **spec))
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
