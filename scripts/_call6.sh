export PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python scripts/quant_decode_sweep.py --formats int4 --shapes 64x8192,1x131072 --heads 32/8,12/12 --all --grid 128,4,2 128,4,2,-1,-1,-1,-1,-1,-1,1 128,4,2,-1,-1,0,-1,-1,-1,1 2>&1 | tee $OUT/sweep_int4.txt
timeout 150 python -m pytest -q -x tests/test_decode_quant.py -k "channel_pairs or v_pairs_fall_back or int4" -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/tests.txt
