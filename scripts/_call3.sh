#!/bin/bash
export PYTHONPATH=src:.peers/fi FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws FLASHINFER_CUDA_ARCH_LIST=9.0
date
timeout 100 python -m pytest -q -x tests/test_decode.py 2>&1 | tail -2
date
timeout 170 python -m kvonce bench quant --dtype fp16 --md $OUT/bq_fp16.md --plot '' > $OUT/bq_fp16.log 2>&1; tail -3 $OUT/bq_fp16.log
date
timeout 280 python -m kvonce bench decode --graph-peers --md $OUT/bd.md --plot '' > $OUT/bd.log 2>&1; tail -3 $OUT/bd.log
date
