export PYTHONPATH=src:.peers/fi PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws FLASHINFER_CUDA_ARCH_LIST=9.0
C="128,128,8,3,r,p,t,g,P"
echo "== sweep $(date +%T)"
timeout 200 python3 scripts/prefill_sweep.py --rows prefill,chunked,mixed --pages 16,256 --graph --rounds 3 --cfg $C,S $C 2>&1 | tail -16
echo "== tests $(date +%T)"
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/test_gluon_prefill.py -k "persistent or padded or graph or cached" 2>&1 | tail -3
echo "== bench $(date +%T)"
timeout 200 python3 -m kvonce bench prefill --md "$OUT/bench_prefill.md" 2>&1 | grep "^|" | tail -14
echo "== done $(date +%T)"
