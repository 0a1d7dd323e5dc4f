#!/usr/bin/env bash
# Every GPU check in one run (a few minutes on one H200), for a machine with an NVIDIA GPU:
#   1. the kernel tests compiled for the device instead of interpreted (TRITON_INTERPRET=0);
#   2. the decode kernel's effective bandwidth at 1k/4k/16k contexts against the HBM peak;
#   3. one decode step of an 8B-shaped model against its weight-read roofline;
#   4. KV blocks moved between two processes with cuda_ipc: bytes checked, GB/s measured.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
export TRITON_INTERPRET=0 PYTHONPATH=.
"$python" -m pytest tests/kernels -q
"$python" scripts/decode_bandwidth.py
"$python" scripts/decode_step_roofline.py
"$python" scripts/gpu_kv_ipc_check.py
