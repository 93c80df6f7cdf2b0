#!/bin/bash
export PYTHONPATH=src
timeout 100 python scripts/quant_decode_sweep.py --formats fp8_e4m3 --dtype fp16 --heads 32/8,12/12 \
  --shapes 64x8192,1x131072 --all --grid 128,4,2 128,4,2,-1,-1,-1,-1,-1,-1,1 128,4,3,-1,-1,-1,-1,-1,-1,1 2>&1 | grep -v "^|---\|^| heads\|^| "
