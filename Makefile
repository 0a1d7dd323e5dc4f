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

# The fast tier: every test with no tier marker (the tiers are declared once, as markers in
# pyproject.toml; --fast is tests/tier_check.py's): policy, engine, kernels, KV transfer, the
# gateway's HTTP against in-process fakes, bench. No test here starts a replica, a gateway or a
# Redis (tests/tier_check.py fails one that does without its marker), so its tests run on
# TEST_WORKERS processes at once (pytest-xdist), a test file to each in turn.
TEST_WORKERS ?= 2

test: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q --fast -n $(TEST_WORKERS) --dist loadfile

# Every tier: the fast one, then, one test at a time, real processes on loopback (e2e, faults), a
# real Redis, wheels and generated code, compose and Kubernetes manifests, the real checkpoint.
# What .ci/run runs.
test-all: test
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q --tiered

clean:
	rm -rf .pytest_cache build *.egg-info

# BENCHMARKS.md's headline, on the real model (SmolLM2-135M-Instruct) and both cores: goodput under
# TTFT <= 2 s and TPOT <= 150 ms, bfloat16 (two searches a system) then float32, pdserve colocated
# and disaggregated beside vLLM; llama.cpp's server on the GGUF as stored; then the engines alone,
# offline; last the report layer, which redraws every table and plot from the JSON and writes the
# headline (its goals table included) into BENCHMARKS.md between its markers. `make bench-report`
# does the last step alone. PEER_VLLM=SCRIPT adds vLLM (../shared/peers/vllm-cpu), and
# PEER_LLAMA_CPP=SCRIPT GGUF=FILE llama.cpp (../shared/peers/llama-cpp; see BENCHMARKS.md).
PEER_VLLM ?=
PEER_LLAMA_CPP ?=
GGUF ?=
PEER_ARG = $(if $(PEER_VLLM),--peer-vllm $(PEER_VLLM))
.PHONY: bench bench-report

bench: install
	$(BIN)/pdserve bench goodput $(PEER_ARG) --dtype bfloat16 --rates 1,2,3,4,5,6.5,8 --repeats 2 \
		--result-dir bench/results/goodput_bf16
	$(BIN)/pdserve bench goodput $(PEER_ARG) --dtype float32 --rates 0.5,0.8,1.2,1.6,2.2,3,4 \
		--result-dir bench/results/goodput_fp32
	$(if $(PEER_LLAMA_CPP),$(BIN)/pdserve bench goodput --systems llama-cpp --peer-llama-cpp $(PEER_LLAMA_CPP) \
		--gguf $(GGUF) --rates 0.25,0.5,1 --result-dir bench/results/goodput_gguf)
	$(BIN)/pdserve bench offline $(PEER_ARG) --num-prompts 64 --output-len 64 --num-runs 2 \
		--result-dir bench/results/offline_smollm2
	$(MAKE) bench-report

bench-report: install
	$(BIN)/pdserve bench report bench/results --benchmarks BENCHMARKS.md
