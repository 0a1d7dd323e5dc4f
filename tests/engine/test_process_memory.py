"""The process's resident memory grows by what it touches."""
import torch

from pdserve.engine.process_memory import resident_bytes


def test_touching_64_mib_adds_them_to_the_resident_memory():
    before = resident_bytes()
    touched = torch.ones(64 << 18)  # 64 MiB of float32, every page written
    assert resident_bytes() - before >= 60 << 20
    del touched
