# kvonce: `make test` (CPU, Triton interpreter) and `make demo` set themselves up from a fresh clone.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvonce-installed
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

# CPU test environment only: torch 2.13.0 CPU build and triton 3.6.0 (the interpreter),
# numpy < 2.4 because the triton 3.6 interpreter breaks on numpy >= 2.4 in loops with runtime bounds.
CPU_PINS := torch==2.13.0 triton==3.6.0 "numpy<=2.3.5"

.PHONY: venv test demo gpu-test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifneq ($(HAS_GPU),1)
	$(PY) -m pip install -q $(CPU_PINS)
endif
	$(PY) -m pip install -q -e ".[test,bench]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -ra tests

demo: $(STAMP)
ifeq ($(HAS_GPU),1)
	$(PY) -m kvonce demo
else
	TRITON_INTERPRET=1 $(PY) -m kvonce demo
endif

# On a CUDA machine with torch and triton already installed (the lent GPU): no venv, no pip.
gpu-test:
	PYTHONPATH=src python3 -m pytest -q -ra tests

bench:
	PYTHONPATH=src python3 -m kvonce bench zigzag

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
