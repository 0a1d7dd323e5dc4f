# Set-up and everyday commands. `make up` runs the system, `make test` runs the tests; both
# create the virtualenv first when needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install protos up test clean

$(BIN)/pdserve: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

install: $(BIN)/pdserve

# The wire code pdserve/v1/ is committed, so that every kind of install has it. After editing
# protos/, regenerate it and commit the result; tests/packaging fails while it is stale.
protos: install
	$(BIN)/python scripts/generate_protos.py

up: install
	$(BIN)/pdserve up

test: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q

clean:
	rm -rf .pytest_cache build *.egg-info

# Regenerates the figures in BENCHMARKS.md (bench/results/): every system side by side on one
# machine, at saturation (equal, then varied lengths) and on the mixed workload.
# PEER_VLLM=SCRIPT adds vLLM (see BENCHMARKS.md).
PEER_VLLM ?=
BENCH_COMPARE = $(BIN)/pdserve bench-compare $(if $(PEER_VLLM),--peer-vllm $(PEER_VLLM))
.PHONY: bench
bench: install
	$(BENCH_COMPARE) --dataset random --num-prompts 128 --input-len 128 --output-len 128 \
		--max-concurrency 32 --result-dir bench/results/saturation
	$(BENCH_COMPARE) --dataset random --num-prompts 128 --input-len 128 --output-len 128 --range-ratio 0.5 \
		--max-concurrency 32 --result-dir bench/results/saturation_varlen
	$(BENCH_COMPARE) --dataset mixed --num-prompts 96 --input-len 64 --output-len 64 \
		--request-rate 2 --result-dir bench/results/mixed
