#!/usr/bin/env bash
# Every GPU check in one run of at most 8 minutes, on a GPU machine with this repository and a
# python3 (3.11+) and nothing else:
#
#   scripts/gpu_check.sh                  # logs and statuses under ./gpu_check_out
#   OUT=/tmp/check scripts/gpu_check.sh
#   GPU_CHECK_PYTHON=.venv/bin/python scripts/gpu_check.sh   # an interpreter set up already: no env step
#
# Steps, each with its own timeout inside one overall deadline; a failing step does not stop
# the run, and a step the deadline leaves no time for is marked SKIP:
#   env           a venv under $OUT (seeing the machine's own packages); `pip install .[test,gpu]`
#                 only if torch, triton, cupy, grpc, redis, transformers or pytest is missing. That
#                 needs PyPI: torch==2.13.0 from there is the CUDA build on Linux x86_64 (it pulls
#                 NVIDIA's runtime wheels), cupy-cuda13x a driver for CUDA 13. Offline, the
#                 machine's own packages must be enough.
#   versions      python, torch (and its CUDA), triton, cupy, driver, GPUs
#   kernels       tests/kernels compiled for the GPU (TRITON_INTERPRET=0): fp32, fp16, bf16
#   warm_up       an engine on GPU 0 compiles no kernel once started; greedy equals the CPU's
#   device_guard  the same on the last GPU: every step runs there (needs 2 GPUs)
#   bandwidth     `pdserve bench decode-kernel --device cuda`: the Triton decode kernel on an 8B
#                 layer (GQA 8:1, head dim 128, bf16), batch 64 at 8k context, against the reference
#                 and the device's read bandwidth
#   roofline      `pdserve bench decode-step --device cuda`: the tiny model's decode step split
#                 into its parts, against its weight+KV read roofline
#   ipc_same_gpu  `pdserve bench kv-transfer --device cuda:0`: cuda_ipc between two processes on
#                 GPU 0, the landed bytes checked
#   ipc_cross_gpu the same from GPU 0 to GPU 1 (needs 2 GPUs)
#   up            `pdserve up --device cuda` on a tiny model: greedy equals transformers
#
# $OUT/status.tsv holds one line per step (step, status, seconds, log); each step's output is
# in $OUT/<step>.log. Exit status: 0 if no step FAILed or TIMEDOUT. A SKIP says what it lacked.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
out=$(mkdir -p "${OUT:-gpu_check_out}" && cd "${OUT:-gpu_check_out}" && pwd)
status_file="$out/status.tsv"
: > "$status_file"
total_budget_s=${GPU_CHECK_BUDGET_S:-480}
deadline_s=$((SECONDS + total_budget_s))
python=${GPU_CHECK_PYTHON:-$out/venv/bin/python}
export out repo python PYTHONPATH=$repo TRITON_INTERPRET=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

skip_step() {  # NAME REASON
    printf '%s\tSKIP\t0\t(%s)\n' "$1" "$2" | tee -a "$status_file"
}

# run_step NAME TIMEOUT_S COMMAND...: runs COMMAND with its output in $OUT/NAME.log, under the
# smaller of TIMEOUT_S and what the overall deadline leaves; exit status 2 means SKIP.
run_step() {
    local name=$1 timeout_s=$2 started_s=$SECONDS status rc
    shift 2
    local left_s=$((deadline_s - SECONDS))
    if ((left_s < 10)); then
        skip_step "$name" "out of time"
        return
    fi
    ((timeout_s > left_s)) && timeout_s=$left_s
    echo "== $name (timeout ${timeout_s}s)"
    timeout --signal=INT --kill-after=15 "$timeout_s" "$@" > "$out/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=PASS ;;
        2) status=SKIP ;;
        124 | 137) status=TIMEOUT ;;
        *) status=FAIL ;;
    esac
    tail -n 25 "$out/$name.log"
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - started_s))" "$out/$name.log" | tee -a "$status_file"
}

setup_env() {
    python3 -m venv --system-site-packages "$out/venv" || return 1
    if "$python" -c "import torch, triton, cupy, grpc, redis, transformers, pytest" 2>/dev/null; then
        echo "every package is at hand; nothing installed"
        return 0
    fi
    "$python" -m pip install --quiet "$repo[test,gpu]"
}

versions() {
    "$python" - <<'EOF'
import platform, torch, triton
print("python", platform.python_version())
print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available())
print("triton", triton.__version__)
try:
    import cupy
    print("cupy", cupy.__version__, "runtime", cupy.cuda.runtime.runtimeGetVersion(),
          "driver", cupy.cuda.runtime.driverGetVersion())
except Exception as error:  # reported, and the cuda_ipc steps then fail on their own
    print("cupy unavailable:", error)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}")
EOF
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv || true
    "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
}

export -f setup_env versions

num_gpus() {
    "$python" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0
}

if [[ -z ${GPU_CHECK_PYTHON:-} ]]; then
    run_step env 200 bash -c setup_env
    if [[ ! -x $python ]]; then  # no venv module: the machine's python3 as it is
        python=$(command -v python3)
        export python
    fi
fi
run_step versions 30 bash -c versions
gpus=$(num_gpus)
run_step kernels 180 "$python" -m pytest -q -p no:cacheprovider tests/kernels
run_step warm_up 45 "$python" scripts/gpu_device_guard_check.py --gpu 0
if ((gpus >= 2)); then
    run_step device_guard 45 "$python" scripts/gpu_device_guard_check.py
else
    skip_step device_guard "$gpus GPU"
fi
run_step bandwidth 45 "$python" -m pdserve bench decode-kernel --device cuda --dtype bfloat16 --num-seqs 64 --num-kv-heads 8 --num-heads 32 --head-dim 128 --min-context 8192 --max-context 8192
run_step roofline 75 "$python" -m pdserve bench decode-step --device cuda --model tiny --batch-sizes 1,32,64
run_step ipc_same_gpu 40 "$python" -m pdserve bench kv-transfer --device cuda:0 --mib 256
if ((gpus >= 2)); then
    run_step ipc_cross_gpu 40 "$python" -m pdserve bench kv-transfer --device cuda:0 --decode-device cuda:1 --mib 256
else
    skip_step ipc_cross_gpu "$gpus GPU"
fi
run_step up 100 "$python" scripts/gpu_up_check.py --device cuda --prefill 1 --decode 1

echo "== summary ($SECONDS s, output in $out)"
column -t -s $'\t' "$status_file" 2>/dev/null || cat "$status_file"
! cut -f2 "$status_file" | grep -qE '^(FAIL|TIMEOUT)$'
