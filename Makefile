# kvonce: `make test` (CPU, Triton interpreter) and `make demo` set themselves up from a fresh clone.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvonce-installed
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

# CPU test environment only: torch 2.13.0 CPU build and triton 3.6.0 (the interpreter),
# numpy < 2.4 because the triton 3.6 interpreter breaks on numpy >= 2.4 in loops with runtime bounds;
# transformers 5.24.0: the newest release the HF adapter was tested on (the test extra's range:
# pyproject.toml; the others: `make test-hf-matrix`). The other test and bench dependencies, and
# transformers' own, are pinned too (the versions a fresh clone resolved on 2026-11-25), so that a
# release overnight cannot change what CI runs.
HF_PINS  := transformers==5.24.0 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0
CPU_PINS := torch==2.13.0 triton==3.6.0 "numpy<=2.3.5" pytest==9.2.0 hypothesis==6.170.17 \
	psutil==7.2.2 tabulate==0.10.0 matplotlib==3.11.2 $(HF_PINS)

# The oldest releases pyproject.toml claims (`make test-oldest`: the CPU suite against them, in
# its own venv). PyPI's Linux torch wheels bring their CUDA libraries (~6 GB installed); where
# download.pytorch.org is reachable, OLDEST_INDEX="--index-url https://download.pytorch.org/whl/cpu
# --extra-index-url https://pypi.org/simple" takes the CPU build instead.
OLDEST_PINS  := torch==2.8.0 triton==3.4.0 "numpy<=2.3.5"
OLDEST_VENV  ?= .venv-oldest
OLDEST_INDEX ?=

# `make test-hf-matrix` (not in CI): the HF test files against each supported transformers
# release, a venv each under $(VENV)/hf-matrix/ (gone with `make clean`), CPU_PINS with that
# release (and what it resolves of its own dependencies) in place of HF_PINS; one pytest
# summary per release, non-zero if any failed.
# Result: README, "Serving an HF model".
HF_MATRIX := 5.17.0 5.23.0 5.24.0
HF_TESTS  := tests/test_integrations_hf_paged.py tests/test_integrations_hf.py tests/test_bench_serve.py

.PHONY: venv test kernel-check test-oldest test-hf-matrix demo gpu-test gpu-test-full gpu-test-part bench clean

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

# Compile every Gluon kernel for sm_90a on the CPU; fail on spills, wgmma serialization, smem.
kernel-check: $(STAMP)
	$(PY) scripts/kernel_check.py

test-oldest:
	python3 -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q $(OLDEST_INDEX) $(OLDEST_PINS)
	$(OLDEST_VENV)/bin/python -m pip install -q -e ".[test]"
	$(OLDEST_VENV)/bin/python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
	TRITON_INTERPRET=1 $(OLDEST_VENV)/bin/python -m pytest -q -ra tests

test-hf-matrix:
	@failed=""; for v in $(HF_MATRIX); do \
	  venv=$(VENV)/hf-matrix/$$v; echo "== transformers $$v ($$venv)"; \
	  { [ -x $$venv/bin/python ] || python3 -m venv $$venv; } && \
	  $$venv/bin/python -m pip install -q $(filter-out $(HF_PINS),$(CPU_PINS)) transformers==$$v && \
	  $$venv/bin/python -m pip install -q -e ".[test,bench]" && \
	  TRITON_INTERPRET=1 $$venv/bin/python -m pytest -q -ra -p no:cacheprovider $(HF_TESTS) \
	  || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-hf-matrix: failed on transformers$$failed"; exit 1; fi; \
	echo "test-hf-matrix: passed on transformers $(HF_MATRIX)"

demo: $(STAMP)
ifeq ($(HAS_GPU),1)
	$(PY) -m kvonce demo
else
	TRITON_INTERPRET=1 $(PY) -m kvonce demo
endif

# On a CUDA machine with torch and triton already installed (the lent GPU): no venv, no pip.
# gpu-test: the fast tier (tests/_tiers.py: every test function, each behaviour value once,
# cheapest cases first). gpu-test-full: every case, part after part. Each part runs as JOBS pytest
# processes sharing the GPU (scripts/gpu_test_parts.py prints the parts and their times);
# PART=n runs one part. Times on the lent H100: docs/benchmarks.md, "GPU test tiers". The fast
# tier runs 8 processes (403 s on the H100, 2026-11-27, against ~555 s with 4: the device's
# commands stop at 600 s); the full parts keep 4 (their float64 references need the memory).
JOBS ?= 4
FAST_JOBS ?= 8
GPU_TEST_ARGS ?=
gpu-test:
	python3 scripts/gpu_test_parts.py --tier fast --jobs $(FAST_JOBS) $(GPU_TEST_ARGS)

gpu-test-full:
	python3 scripts/gpu_test_parts.py --jobs $(JOBS)

gpu-test-part:
	python3 scripts/gpu_test_parts.py --part $(PART) --jobs $(JOBS)

bench:
	PYTHONPATH=src python3 -m kvonce bench zigzag

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .pytest_cache .hypothesis
