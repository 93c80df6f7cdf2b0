export PYTHONPATH=src PYTHONUNBUFFERED=1
cd scripts
for page in 16 256; do
  echo "== page $page"
  PYTHONPATH=../src:. timeout 240 ncu --clock-control base -k regex:gluon_prefill --launch-skip 2 \
    --launch-count 1 \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed.max,smsp__inst_executed.min,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__issue_active.max.pct_of_peak_sustained_active,smsp__issue_active.min.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    python3 prefill_ncu_case.py prefill $page 2>&1 | grep -v '^==PROF==' | grep -E '__' | awk '$NF+0 > 0.005 || /inst|issue_active|duration|tensor/' | head -60
done
cd ..
timeout 150 python3 scripts/knob_run.py "kvonce.kernels.gluon_prefill:SCALAR_PAGES=True" -m pytest -q -p no:cacheprovider tests/test_gluon_prefill.py -k "against_reference and (16-128-3 or 256-128-3 or 64-128-3)" 2>&1 | tail -2
C="128,128,8,3,r,p,t,g,P"
timeout 200 python3 scripts/prefill_sweep.py --rows prefill --pages 16,256 --graph --rounds 4 --cfg $C $C,S 2>&1 | tail -7
