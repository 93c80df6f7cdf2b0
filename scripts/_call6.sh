#!/bin/bash
export PYTHONPATH=src
date
timeout 120 python -m pytest -q -x tests/test_decode_quant.py -k "channel_pair or every_unit or bf16_queries or every_byte" 2>&1 | tail -2
date
for dt in fp16 bf16; do
timeout 110 python scripts/quant_decode_sweep.py --formats fp8_e4m3 --dtype $dt --heads 32/8,12/12 \
  --shapes 64x8192,1x131072 --all --grid 128,4,2 128,4,2,-1,-1,-1,-1,-1,-1,1 2>&1 | grep -v "^|---\|^| heads\|^| "
done
date
