# `make run`: set up, then train the default experiment on CPU. `make test`: set up, then the suite.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOB_DIR ?= /tmp/paxlike/stdlib_tiny
PYTEST_ARGS ?= -n 2 --dist worksteal

# Python >= 3.12 (jax 0.12 needs it): PATH first, then pyenv's versions.
PYTHON ?= $(shell for p in python3.12 python3.13 python3; do \
	  c=$$(command -v $$p 2>/dev/null) && $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo $$c; exit; }; \
	done; for c in $$(pyenv root 2>/dev/null)/versions/3.1[2-9]*/bin/python3 $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3; do \
	  [ -x $$c ] && { echo $$c; exit; }; done)

.PHONY: setup run test bench clean peers
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@if [ -z "$(PYTHON)" ]; then echo "paxlike needs Python >= 3.12 (jax 0.12). Install it (e.g. 'pyenv install 3.12') or pass PYTHON=/path/to/python3.12." >&2; exit 2; fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	{ $(PY) -m pip install -q -c constraints.txt uv && \
	  $(PY) -m uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt -e '.[test]'; } || { \
	  echo "uv could not be installed or reach its index; installing with pip, which reads pip's own configuration" >&2; \
	  $(PY) -m pip install -q -c constraints.txt -e '.[test]'; }
	@touch $(STAMP)

run: setup
	$(PY) -m paxlike.main --exp=lm.StdlibTiny --job_log_dir=$(JOB_DIR)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS) tests

BENCHMARKS := overhead federated_round checkpoint_cost startup cpu_step

bench: setup
	@for b in $(BENCHMARKS); do $(PY) benchmarks/$$b.py || exit 1; done

# The peers paxlike is measured against (benchmarks/peers/), in a venv of their own: never
# paxlike's dependencies, never imported by the suite. PyPI's torch wheel (CUDA build, ~5.6 GB
# installed) unless TORCH_INDEX names another index (e.g. PyTorch's CPU wheels).
PEERS_VENV := .venv-peers
TORCH_INDEX ?=
MAXTEXT_VERSION := 0.2.5
peers: $(PEERS_VENV)/.installed $(PEERS_VENV)/.maxtext

$(PEERS_VENV)/.installed:
	@[ -x $(PEERS_VENV)/bin/python ] || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch
	$(PEERS_VENV)/bin/python -m pip install -q transformers peft safetensors trl
	@touch $@

# MaxText's wheel declares no dependencies: it ships the lock for running without Google Cloud
# (decoupled-requirements.txt), installed here minus its CUDA wheels, with paxlike's jax and the
# peers' torch, transformers and peft held; its mpmath floor goes (it would take sympy below
# what torch needs).
$(PEERS_VENV)/.maxtext: $(PEERS_VENV)/.installed
	$(PEERS_VENV)/bin/python -m pip install -q --no-deps maxtext==$(MAXTEXT_VERSION)
	@set -e; py=$(PEERS_VENV)/bin/python; \
	lock=$$($$py -c 'import importlib.metadata as m; print(next(f.locate() for f in m.files("maxtext") if f.name == "decoupled-requirements.txt"))'); \
	grep -v -E '^(cuda-|nvidia-|mpmath)' $$lock > $(PEERS_VENV)/maxtext-requirements.txt; \
	{ grep -E '^jax(lib)?==' constraints.txt; $$py -m pip freeze | grep -i -E '^(torch|transformers|peft)=='; \
	  echo 'sympy>=1.13.3'; } > $(PEERS_VENV)/maxtext-constraints.txt; \
	echo "$$py -m pip install -r $(PEERS_VENV)/maxtext-requirements.txt -c $(PEERS_VENV)/maxtext-constraints.txt"; \
	$$py -m pip install -q -r $(PEERS_VENV)/maxtext-requirements.txt -c $(PEERS_VENV)/maxtext-constraints.txt
	@touch $@

clean:
	rm -rf $(VENV)
