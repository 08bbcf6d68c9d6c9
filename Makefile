# `make demo` and `make test` each set up .venv on a fresh machine (Python 3.11 and the
# package registries are all they need), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench gpu-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet --upgrade "pip>=25.1"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[all]" --group dev
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m warpbridge demo

test: $(STAMP)
	$(PY) -m ruff check warpbridge tests benchmarks examples
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(PY) -m ruff check warpbridge tests benchmarks examples
	$(PY) -m ruff format --check warpbridge tests benchmarks examples

bench: $(STAMP)
	$(PY) -m warpbridge bench

# On a machine with a CUDA GPU, whose python3 has CUDA PyTorch, warp-lang, SciPy and pytest
# (not .venv: the constraints pin PyTorch's CPU build): the gpu-marked tests, then the GPU
# benchmarks at the tutorial's sizes, each writing its JSON (with the device name).
gpu-check:
	bash .ci/gpu

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
