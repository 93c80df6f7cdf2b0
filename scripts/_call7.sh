export PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python -m pytest -q tests/test_key_outliers.py tests/test_decode_quant.py tests/test_prefix_decode.py -k "int4" -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/tests.txt
timeout 80 python scripts/quant_decode_sweep.py --formats int4 --outliers 8 --shapes 64x8192,1x131072 --heads 32/8 --grid 128,4,2 128,4,2,-1,-1,-1,-1,-1,-1,0 2>&1 | tee $OUT/out8.txt
