"""Attention-logit softcapping in the Triton kernels: s -> cap * tanh(s / cap).

tanh is written through the sigmoid (tanh x = 2 sigmoid(2x) - 1), which compiles to one exp and
runs under the interpreter, where Triton has no tanh.
"""
import triton
import triton.language as tl


@triton.jit
def softcap(scores, cap):
    return cap * (2 * tl.sigmoid(2 * scores / cap) - 1)
