#!/bin/bash
export PYTHONPATH=src:.peers/fi FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws FLASHINFER_CUDA_ARCH_LIST=9.0
date
timeout 250 python -m pytest -q tests/test_decode_quant.py "tests/test_paged_prefill.py::test_quantized_cache_matches_dequantized_reference" 2>&1 | tail -3
date
timeout 165 python -m kvonce bench quant --dtype bf16 --md $OUT/bq_bf16.md --plot '' > $OUT/bq_bf16.log 2>&1; tail -2 $OUT/bq_bf16.log
date
