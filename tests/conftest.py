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
    from pdserve.tiny_model import write_tiny_model

    written = {}

    def make(**spec) -> str:
        key = tuple(sorted(spec.items()))
        if key not in written:
            written[key] = str(write_tiny_model(tmp_path_factory.mktemp("model"), **spec))
        return written[key]

    return make
