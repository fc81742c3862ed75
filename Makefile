# `make run`: set up, then train the default experiment on CPU. `make test`: set up, then the suite.
# Two supported sets, each with its own constraints file and venv, side by side:
#   Python >= 3.12, jax 0.12 (constraints.txt, .venv): preferred when such a Python is found;
#   Python 3.11, jax 0.10.2, flax 0.12.8, orbax-checkpoint 0.12.4, as TPU machines have them
#   (constraints-py311.txt, .venv-py311): `PYTHON=python3.11 make test`.
SHELL := /bin/bash
JOB_DIR ?= /tmp/paxlike/stdlib_tiny
PYTEST_ARGS ?= -n 2 --dist worksteal

# Python >= 3.12 first (PATH, then pyenv's versions), else Python 3.11 (PATH, then pyenv's).
PYTHON ?= $(shell for p in python3.12 python3.13 python3; do \
	  c=$$(command -v $$p 2>/dev/null) && $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo $$c; exit; }; \
	done; for c in $$(pyenv root 2>/dev/null)/versions/3.1[2-9]*/bin/python3 $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3; do \
	  [ -x $$c ] && { echo $$c; exit; }; done; \
	for c in $$(command -v python3.11 python3 2>/dev/null) $$(pyenv root 2>/dev/null)/versions/3.11*/bin/python3; do \
	  [ -x $$c ] && $$c -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null && { echo $$c; exit; }; done)
# The set follows the interpreter's version: 3.11 gets the JAX 0.10 set, 3.12 and later the JAX 0.12 set.
PYVER := $(if $(PYTHON),$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null))
ifeq ($(PYVER),3.11)
VENV ?= .venv-py311
CONSTRAINTS ?= constraints-py311.txt
else
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
endif
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test bench clean peers
setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@if [ -z "$(PYVER)" ]; then echo "paxlike needs Python >= 3.12 (jax 0.12) or 3.11 (jax 0.10). Install one (e.g. 'pyenv install 3.12') or pass PYTHON=/path/to/python3.12." >&2; exit 2; fi
	@case "$(PYVER)" in 3.1[1-9]) ;; *) echo "paxlike needs Python >= 3.11, and $(PYTHON) is $(PYVER). Install 3.12 (e.g. 'pyenv install 3.12') or pass PYTHON=/path/to/python3.12." >&2; exit 2;; esac
	@echo "paxlike: Python $(PYVER) ($(PYTHON)) into $(VENV) with $(CONSTRAINTS)"
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	{ $(PY) -m pip install -q -c $(CONSTRAINTS) uv && \
	  $(PY) -m uv pip install -q --compile-bytecode --python $(PY) -c $(CONSTRAINTS) -e '.[test]'; } || { \
	  echo "uv could not be installed or reach its index; installing with pip, which reads pip's own configuration" >&2; \
	  $(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[test]'; }
	@touch $(STAMP)

run: setup
	$(PY) -m paxlike.main --exp=lm.StdlibTiny --job_log_dir=$(JOB_DIR)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS) tests

BENCHMARKS := overhead federated_round checkpoint_cost startup cpu_step

bench: setup
	@for b in $(BENCHMARKS); do $(PY) -m benchmarks.$$b || exit 1; done

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
	{ grep -E '^jax(lib)?==' $(CONSTRAINTS); $$py -m pip freeze | grep -i -E '^(torch|transformers|peft)=='; \
	  echo 'sympy>=1.13.3'; } > $(PEERS_VENV)/maxtext-constraints.txt; \
	echo "$$py -m pip install -r $(PEERS_VENV)/maxtext-requirements.txt -c $(PEERS_VENV)/maxtext-constraints.txt"; \
	$$py -m pip install -q -r $(PEERS_VENV)/maxtext-requirements.txt -c $(PEERS_VENV)/maxtext-constraints.txt
	@touch $@

clean:
	rm -rf .venv .venv-py311

# The wheels a TPU machine (Python 3.11, no network) lacks from its own index, listed in
# tpu-wheels.txt: cp311 manylinux wheels, or pure ones; promise ships only an sdist, built here.
TPU_WHEELS := tpu-wheels
.PHONY: tpu-wheels
tpu-wheels: $(TPU_WHEELS)/.complete

$(TPU_WHEELS)/.complete: tpu-wheels.txt
	@mkdir -p $(TPU_WHEELS)
	grep -v -E '^(#|promise==|$$)' tpu-wheels.txt > $(TPU_WHEELS)/binary.txt
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
	  --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(TPU_WHEELS) -r $(TPU_WHEELS)/binary.txt
	$(PYTHON) -m pip wheel -q --no-deps -w $(TPU_WHEELS) $$(grep -E '^promise==' tpu-wheels.txt)
	@rm $(TPU_WHEELS)/binary.txt
	@du -sh $(TPU_WHEELS) | awk '{print "tpu-wheels: " $$1 " in $(TPU_WHEELS)/ (carry it to the TPU machine)"}'
	@touch $@
