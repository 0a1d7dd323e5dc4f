#!/usr/bin/env bash
# Every GPU check in one run of at most 8 minutes, on a GPU machine with this repository and a
# python3 (3.11+): `scripts/gpu_check.sh`, OUT=DIR for the logs (default ./gpu_check_out),
# GPU_CHECK_PYTHON=.venv/bin/python for an interpreter set up already (no env step). The steps:
# env (a venv under $OUT seeing the machine's packages, `pip install .[test,gpu]` only if one is
# missing), versions, kernels (tests/kernels compiled for the GPU), engine (tests/gpu), then
# `pdserve bench` decode-kernel, decode-step and kv-transfer on the GPU (across two where there are).
# Each step runs under its own timeout within the overall one, its output in $OUT/STEP.log; a
# line per step (step, status, seconds) goes to $OUT/status.tsv. Exit 0 unless a step FAILs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${OUT:-gpu_check_out}" && cd "${OUT:-gpu_check_out}" && pwd)
python=${GPU_CHECK_PYTHON:-$out/venv/bin/python}
deadline_s=$((SECONDS + ${GPU_CHECK_BUDGET_S:-480}))
export PYTHONPATH=$PWD TRITON_INTERPRET=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
: > "$out/status.tsv"

run_step() {  # NAME TIMEOUT_S COMMAND...
    local name=$1 timeout_s=$2 started_s=$SECONDS status=PASS
    shift 2
    ((timeout_s > deadline_s - SECONDS)) && timeout_s=$((deadline_s - SECONDS))
    if ((timeout_s < 10)); then status=SKIP; else
        echo "== $name (timeout ${timeout_s}s)"
        timeout --kill-after=15 "$timeout_s" "$@" > "$out/$name.log" 2>&1 || status=FAIL
        tail -n 20 "$out/$name.log"
    fi
    printf '%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - started_s))" | tee -a "$out/status.tsv"
}

if [[ -z ${GPU_CHECK_PYTHON:-} ]]; then
    run_step env 200 bash -c "python3 -m venv --system-site-packages '$out/venv' && { '$python' -c \
        'import torch, triton, cupy, grpc, redis, transformers, pytest' || '$python' -m pip install -q '.[test,gpu]'; }"
    [[ -x $python ]] || python=$(command -v python3)  # no venv module: the machine's python3 as it is
fi
run_step versions 30 "$python" -c "import platform, torch, triton; print(platform.python_version(), torch.__version__, \
    torch.version.cuda, triton.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
gpus=$("$python" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
run_step kernels 180 "$python" -m pytest -q -p no:cacheprovider tests/kernels
run_step engine 190 "$python" -m pytest -q -p no:cacheprovider -m gpu tests/gpu
run_step bandwidth 45 "$python" -m pdserve bench decode-kernel --device cuda --dtype bfloat16 --num-seqs 64 --num-kv-heads 8 --num-heads 32 --head-dim 128 --min-context 8192 --max-context 8192
run_step roofline 75 "$python" -m pdserve bench decode-step --device cuda --model tiny --batch-sizes 1,32,64
run_step ipc_same_gpu 40 "$python" -m pdserve bench kv-transfer --device cuda:0 --mib 256
if ((gpus >= 2)); then
    run_step ipc_cross_gpu 40 "$python" -m pdserve bench kv-transfer --device cuda:0 --decode-device cuda:1 --mib 256
else printf 'ipc_cross_gpu\tSKIP\t0\n' | tee -a "$out/status.tsv"; fi
column -t "$out/status.tsv"
! grep -q FAIL "$out/status.tsv"
