"""Test-wide set-up: Triton kernels run under the interpreter unless a GPU run says otherwise.

The interpreter flag must be set before any module that defines a Triton kernel is imported.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
