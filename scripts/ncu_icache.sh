# Stall reasons (no_instruction: the instruction cache) and per-instruction counters of the Gluon
# prefill, 8 x 2048, at page 16, page 256 with 16-row boxes, and page 256 (issue 26's probe).
# NCU_FLAGS: e.g. "--clock-control none --cache-control none" (boost clocks, warm L2).
export PYTHONPATH=src:scripts
M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum'
run() { name=$1; box=$2; page=$3
  timeout 150 ncu $NCU_FLAGS -k regex:gluon_prefill --launch-skip 2 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --metrics "$M" -o "$OUT/$name" -f \
    python scripts/knob_run.py "kvonce.kernels.gluon_prefill:BOX_ROWS=$box" \
    -m prefill_ncu_case prefill "$page" > "$OUT/$name.txt" 2>&1 || tail -5 "$OUT/$name.txt"
  ncu -i "$OUT/$name.ncu-rep" --page raw --csv > "$OUT/$name.raw.csv"
}
run p16 None 16
run p256b16 16 256
run p256 None 256
ls -la "$OUT"
