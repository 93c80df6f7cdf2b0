export PYTHONPATH=src; source .venv/bin/activate 2>/dev/null
timeout 200 python3 -m pytest -q -x tests/test_gluon_prefill.py -k "(item_lookup_and_kv and WIDE) or wide_lookup_many" > $OUT/t.log 2>&1; tail -2 $OUT/t.log
timeout 220 python3 scripts/prefill_page_order.py --rows prefill,chunked,mixed --rounds 3 --variants 16:random,16:random:wl,16:random:wl:el,256:random,256:random:wl 2>&1 | tail -18
(cd scripts && PYTHONPATH=../src:. timeout 90 python3 knob_run.py "kvonce.kernels.gluon_prefill:WIDE_LOOKUP=True" -m prefill_item_trace --rows prefill,chunked --pages 16 2>&1 | tail -4)
