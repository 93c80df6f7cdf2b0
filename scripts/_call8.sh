export PYTHONPATH=src
python scripts/_det.py 2>&1 | tail -12
timeout 100 python -m pytest -q -x tests/test_decode_quant.py -k "head_major_pages_decode_and_append_alike and int4" -p no:cacheprovider --tb=short 2>&1 | grep -v "^  warn\|Warning" | tail -30
