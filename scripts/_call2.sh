#!/bin/bash
export PYTHONPATH=src
date
timeout 270 python -m pytest -q -x tests/test_decode_quant.py 2>&1 | tail -3
date
for dt in bf16 fp16; do
timeout 140 python scripts/quant_decode_sweep.py --formats fp8_e4m3 --dtype $dt --heads 32/8,12/12 \
  --shapes 64x8192,1x131072 --all --grid 128,4,2 128,4,2,3,-1,168 128,4,2,-1,-1,168 64,2,3 128,4,3,3,-1,168 2>&1 | grep -v "^|---\|^| heads"
done
date
