"""Run a module or pytest with every family of ``paged_combine.COMBINE_PDL`` on (1) or off (0)
(issue 26's device steps).

    PYTHONPATH=src python scripts/pdl_run.py 1 -m pytest tests/test_decode.py
    PYTHONPATH=src python scripts/pdl_run.py 1 -m kvonce bench quant ...
"""
import runpy
import sys

from kvonce.kernels import paged_combine

paged_combine.set_combine_pdl(bool(int(sys.argv[1])))
if sys.argv[2] != "-m":
    raise SystemExit("usage: pdl_run.py 0|1 -m MODULE [ARGS...]")
sys.argv = [sys.argv[3]] + sys.argv[4:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
