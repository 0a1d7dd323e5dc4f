#!/usr/bin/env bash
# Kernel checks on an NVIDIA GPU: the kernel tests compiled for the device instead of interpreted
# (inputs move to CUDA when TRITON_INTERPRET=0), then the decode kernel's effective bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
export TRITON_INTERPRET=0
"$python" -m pytest tests/kernels -q
PYTHONPATH=. "$python" scripts/decode_bandwidth.py "$@"
