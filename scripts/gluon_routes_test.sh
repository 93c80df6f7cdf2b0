#!/usr/bin/env bash
# tests/test_gluon_decode.py split by route, one pytest process each at once on the one GPU (a
# crashed launch, e.g. a misaligned TMA, poisons only its own route's CUDA context). Logs: $OUT.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
declare -A K=([shipped]="not ring and not token and not int4 and not biased and not swapped"
              [ring]="ring" [token]="token" [int4]="int4 and not swapped"
              [vbias]="biased and not swapped" [swap]="swapped and not t256" [t256]="t256"
              [int4swap]="int4 and swapped and not t256")
for r in ${ROUTES:-shipped ring token int4}; do
  timeout ${ROUTE_S:-420} python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gluon_decode.py \
    -k "${K[$r]}" > "$OUT/gluon_$r.log" 2>&1 &
done
wait
for r in ${ROUTES:-shipped ring token int4}; do
  echo "== $r"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gluon_$r.log" | head -12 | cut -c1-300
  grep -m3 -E "^E  " "$OUT/gluon_$r.log" | cut -c1-300
done
