# Set-up and everyday commands. `make up` runs the system, `make test` runs the fast tests and
# `make test-all` every test; all create the virtualenv first when needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install protos up test test-all clean

$(BIN)/pdserve: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

install: $(BIN)/pdserve

# The wire code protos/pdserve/v1/ (package pdserve.v1) is committed, so that every kind of install has it. After editing
# protos/, regenerate it and commit the result; tests/packaging fails while it is stale.
protos: install
	$(BIN)/python scripts/generate_protos.py

up: install
	$(BIN)/pdserve up

# The fast tier: unit, engine, kernels, KV transfer, gateway policy, bench and HTTP against
# in-process fakes; no test here starts a replica, a gateway or a Redis (tests/tier_check.py fails
# one that does without its marker). The markers are declared in pyproject.toml.
PROCESS_TIERS = e2e or faults or redis or packaging or deploy or real_model
test: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m "not ($(PROCESS_TIERS))"

# Every tier: the fast one, then real processes on loopback (e2e, faults), a real Redis, wheels and
# generated code, compose and Kubernetes manifests, the real checkpoint. What .ci/run runs.
test-all: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q

clean:
	rm -rf .pytest_cache build *.egg-info

# Regenerates the figures in BENCHMARKS.md (bench/results/): every system side by side on one
# machine, at saturation (equal, then varied lengths, then bfloat16), on the mixed workload (one
# server core; then colocated against disaggregated on two), on prompt-heavy prompts (float32,
# then bfloat16), on heavy-tailed outputs with goodput under an SLO; then the offline engines'
# table and the KV transports' bandwidth; last, every goal against them (bench/results/goals.md).
# Before the offline table: prefix caching on a shared system prompt and on multi-turn chats (on,
# off, and vLLM with its own on), then cache-aware against load-only routing over 2 decode replicas.
# PEER_VLLM=SCRIPT adds vLLM (see BENCHMARKS.md).
PEER_VLLM ?=
PEER_ARG = $(if $(PEER_VLLM),--peer-vllm $(PEER_VLLM))
BENCH_COMPARE = $(BIN)/pdserve bench-compare $(PEER_ARG)
.PHONY: bench bench-goodput

# BENCHMARKS.md's headline, on the real model (SmolLM2-135M-Instruct) and both cores: goodput under
# TTFT <= 2 s and TPOT <= 150 ms, bfloat16 (two searches a system) then float32, pdserve colocated
# and disaggregated beside vLLM; then the engines alone, offline, on the same model.
bench-goodput: install
	$(BIN)/pdserve bench goodput $(PEER_ARG) --dtype bfloat16 --rates 1,2,3,4,5,6.5,8 --repeats 2 \
		--result-dir bench/results/goodput_bf16
	$(BIN)/pdserve bench goodput $(PEER_ARG) --dtype float32 --rates 0.5,0.8,1.2,1.6,2.2,3,4 \
		--result-dir bench/results/goodput_fp32
	$(BIN)/python -m pdserve.bench.offline_compare $(PEER_ARG) --model "$$($(BIN)/pdserve model fetch)" \
		--cpus 0,1 --num-prompts 64 --output-len 64 --num-runs 2 --result-dir bench/results/offline_smollm2

bench: install
	$(BENCH_COMPARE) --dataset random --num-prompts 128 --input-len 128 --output-len 128 \
		--max-concurrency 32 --result-dir bench/results/saturation
	$(BENCH_COMPARE) --dataset random --num-prompts 128 --input-len 128 --output-len 128 --range-ratio 0.5 \
		--max-concurrency 32 --result-dir bench/results/saturation_varlen
	$(BENCH_COMPARE) --dataset random --num-prompts 128 --input-len 128 --output-len 128 \
		--max-concurrency 32 --dtype bfloat16 --result-dir bench/results/saturation_bf16
	$(BENCH_COMPARE) --dataset mixed --num-prompts 96 --input-len 64 --output-len 64 \
		--request-rate 2 --result-dir bench/results/mixed
	$(BIN)/pdserve bench-compare --systems colocated,disaggregated --server-cpus 0,1 --client-cpus 0,1 \
		--dataset mixed --num-prompts 96 --input-len 64 --output-len 64 \
		--request-rate 2 --result-dir bench/results/mixed_two_cores
	$(BENCH_COMPARE) --dataset prompt-heavy --num-prompts 64 --output-len 64 --max-concurrency 32 \
		--dtype float32 --result-dir bench/results/prompt_heavy_fp32
	$(BENCH_COMPARE) --dataset prompt-heavy --num-prompts 64 --output-len 64 --max-concurrency 32 \
		--dtype bfloat16 --result-dir bench/results/prompt_heavy_bf16
	$(BENCH_COMPARE) --dataset heavy-tailed --num-prompts 128 --input-len 128 --range-ratio 0.5 --output-len 128 \
		--max-concurrency 32 --goodput ttft:1000 tpot:50 --result-dir bench/results/heavy_tailed
	$(BENCH_COMPARE) --systems colocated,colocated-nocache,vllm --dataset random --prefix-len 1024 \
		--input-len 64 --output-len 32 --num-prompts 96 --max-concurrency 16 --result-dir bench/results/shared_prefix
	$(BENCH_COMPARE) --systems colocated,colocated-nocache,vllm --dataset multi-turn --prefix-len 256 \
		--input-len 64 --output-len 64 --num-prompts 96 --max-concurrency 16 --result-dir bench/results/multi_turn
	$(BIN)/pdserve bench-compare --systems disaggregated,disaggregated-load --decode-replicas 2 \
		--server-cpus 0,1 --client-cpus 0,1 --dataset multi-turn --prefix-len 256 --input-len 64 --output-len 64 \
		--num-prompts 96 --request-rate 4 --result-dir bench/results/prefix_routing
	$(BIN)/python -m pdserve.bench.offline_compare $(PEER_ARG) --num-prompts 64 --output-len 64 \
		--result-dir bench/results/offline
	$(BIN)/python -m pdserve.bench.kv_transfer --repeats 10 --json bench/results/kv_transfer.json
	$(BIN)/python -m pdserve.bench.goals bench/results
