#!/usr/bin/env bash
# Issue 25's GPU checks, in steps (STEPS="tests fwdbuf zz contig det bench consan csan"; default "zz det"):
#   tests   the Gluon backward's pytest files (contiguous, zigzag buffer, dispatch, helpers)
#   fwdbuf  scripts/zigzag_fwd_buffer.py + the zigzag-buffer TMA forward test (the CP forward)
#   zz      scripts/gluon_bwd_zigzag_check.py (the CP-path Gluon backward: correctness + timing)
#   contig  scripts/gluon_bwd_gpu_check.py --no-bench (the default contiguous kernel)
#   det     the deterministic=True test (bitwise-equal backwards on sm90)
#   bench   python -m kvonce bench zigzag --backward (every Llama row, peers in the same run)
#   csan    compute-sanitizer memcheck and racecheck on small Gluon cases
#   consan  Gluon's concurrency sanitizer on the small cases
# Logs under $OUT. ZZ_ARGS / BENCH_ARGS add arguments.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-"zz det"}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
step() { echo "== $1 ($(date +%T))"; }
if [[ $STEPS == *tests* ]]; then
  step tests; timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -x \
    tests/test_gluon_bwd_helpers.py tests/test_gluon_bwd_zigzag.py \
    tests/test_zigzag_gluon_dispatch.py tests/test_dual_group_backward.py -k "${TESTS_K:-not compile}" \
    2>&1 | tail -4
fi
if [[ $STEPS == *fwdbuf* ]]; then
  step fwdbuf-test; timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_fused_dual_group_flash_attn_varlen.py -k "tma or one_group or replacement" 2>&1 | tail -4
  step fwdbuf; timeout 400 python3 scripts/zigzag_fwd_buffer.py ${FWDBUF_ARGS:-} 2>&1 | tee "$OUT/fwdbuf.txt" | tail -14
fi
if [[ $STEPS == *zz* ]]; then
  step zz; timeout ${ZZ_TIMEOUT:-420} python3 scripts/gluon_bwd_zigzag_check.py ${ZZ_ARGS:-} 2>&1 | tee "$OUT/zz.txt" | grep -v "^{" | tail -60
fi
if [[ $STEPS == *contig* ]]; then
  step contig; timeout 300 python3 scripts/gluon_bwd_gpu_check.py --no-bench 2>&1 | tee "$OUT/contig.txt" | grep -v "^{" | tail -20
fi
if [[ $STEPS == *det* ]]; then
  step det; timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_dual_group_backward.py -k deterministic 2>&1 | tail -5
fi
if [[ $STEPS == *bench* ]]; then
  step bench; timeout ${BENCH_TIMEOUT:-540} python3 -m kvonce bench zigzag --backward --no-docs ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt" | tail -40
fi
if [[ $STEPS == *consan* ]]; then
  # ~70 s a case under ConSan (2026-11-25, H100), two at a time
  step consan; GLUON_TIMEOUT_S=200 TRITON_INSTRUMENTATION_MODE=consan timeout ${CONSAN_TIMEOUT:-560} \
    python3 scripts/gluon_bwd_gpu_check.py --consan --no-bench --jobs 2 \
    --only ${CONSAN_CASES:-0 3 7 10} 2>&1 | tee "$OUT/consan.txt" | grep -v "^{" | tail -20
fi
if [[ $STEPS == *csan* ]]; then
  for tool in ${CSAN_TOOLS:-memcheck racecheck}; do
    step "sanitizer $tool"
    timeout 240 compute-sanitizer --tool $tool --print-limit 20 python3 scripts/gluon_bwd_gpu_check.py --case 3 2>&1 | grep -v "^{" | tail -15
  done
fi
echo "== done ($(date +%T))"
