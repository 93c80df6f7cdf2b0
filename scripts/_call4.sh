#!/bin/bash
export PYTHONPATH=src:.peers/fi FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws FLASHINFER_CUDA_ARCH_LIST=9.0
date
timeout 130 python -m pytest -q -x tests/test_decode_quant.py "tests/test_paged_prefill.py::test_quantized_cache_matches_dequantized_reference" 2>&1 | tail -2
date
timeout 150 python -m kvonce bench quant --dtype bf16 --md $OUT/bq_bf16.md --plot '' > $OUT/bq_bf16.log 2>&1; tail -2 $OUT/bq_bf16.log
date
timeout 190 python scripts/quant_decode_sweep.py --formats fp8_e4m3,int8,int4 --dtype fp16 --heads 32/8,12/12 \
  --shapes 64x8192,1x131072 --all --grid 128,4,2,-1,-1,-1,-1,-1,0 128,4,2,-1,-1,-1,-1,-1,1 2>&1 | grep -v "^|---\|^| heads"
date
timeout 120 python -m kvonce bench quant --dtype fp16 --md $OUT/bq_fp16.md --plot '' > $OUT/bq_fp16.log 2>&1; tail -2 $OUT/bq_fp16.log
date
