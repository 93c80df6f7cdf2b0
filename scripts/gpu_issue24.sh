#!/usr/bin/env bash
# Issue 24's GPU checks in one device call: fp32 errors per family (TF32 vs IEEE), the fp32
# GPU tests, the HF continuous-batching tests on the device's transformers and on the carried
# 5.24 wheel (.whl), and bench serve on 5.24 with each adapter path. Logs under $OUT.
#   STEPS="fp32 hf serve" (default all); SERVE_ARGS: extra bench serve arguments
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-"fp32 hf serve"}
if [[ $STEPS == *fp32* ]]; then
  echo "== fp32 errors"; python3 scripts/fp32_errors.py 2>&1 | tee "$OUT/fp32_errors.txt"
  echo "== fp32 tests"; python3 -m pytest -q -p no:cacheprovider tests/test_fp32_precision.py 2>&1 | tail -15
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/transformers-5.24.0-*.whl || exit 1
if [[ $STEPS == *hf* ]]; then
  echo "== HF tests, device transformers"
  python3 -c "import transformers; print('transformers', transformers.__version__)"
  python3 -m pytest -q -p no:cacheprovider -rs tests/test_integrations_hf_paged.py 2>&1 | tail -8
  echo "== HF tests, transformers 5.24 (carried wheel)"
  PYTHONPATH=/tmp/site:src python3 -m pytest -q -p no:cacheprovider -rs tests/test_integrations_hf_paged.py 2>&1 | tail -4
fi
if [[ $STEPS == *serve* ]]; then
  echo "== bench serve, 5.24, each path"
  PYTHONPATH=/tmp/site:src timeout ${SERVE_TIMEOUT:-300} python3 -m kvonce bench serve --gathered --no-progress --json "$OUT/serve_524.json" ${SERVE_ARGS:-} 2>&1 | grep -v "^{\|FutureWarning\|requested_implementation" | tail -14
fi
