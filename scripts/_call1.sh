#!/bin/bash
export PYTHONPATH=src:.peers/fi FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws FLASHINFER_CUDA_ARCH_LIST=9.0
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
date
timeout 150 python -m pytest -q -x tests/test_decode_quant.py 2>&1 | tail -3
date
timeout 240 python scripts/quant_decode_sweep.py --formats fp8_e4m3 --dtype bf16 --heads 32/8,12/12 \
  --shapes 64x8192,1x131072 --all --grid 128,4,2,-1,-1,-1,-1,0 128,4,2,-1,-1,-1,-1,1 \
  64,4,2 64,4,3 64,2,3 64,1,3 128,2,2 128,8,2 128,4,2,-1,-1,-1,-1,0 2>&1 | tail -30
date
timeout 180 python -m kvonce bench quant --dtype bf16 --md $OUT/bq_bf16.md --plot '' 2>&1 | tail -25
date
