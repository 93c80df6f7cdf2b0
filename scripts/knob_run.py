"""Run a module (pytest, a bench) with module attributes set first (issue 26's device steps):

    PYTHONPATH=src python scripts/knob_run.py \\
        "kvonce.kernels.gluon_decode:GLUON_ONE_CTA_VARIANT={'stages': 4, 'ctas_per_sm': 1, \\
        'ring_merge': False}" -m pytest tests/test_gluon_decode.py

Each ``MODULE:ATTR=VALUE`` before ``-m`` sets ``MODULE.ATTR`` to the Python literal ``VALUE``
(``ast.literal_eval``); the rest runs as ``python -m``.
"""
import ast
import importlib
import runpy
import sys

if "-m" not in sys.argv[1:]:
    raise SystemExit("usage: knob_run.py MODULE:ATTR=VALUE [...] -m MODULE [ARGS...]")
split = sys.argv.index("-m")
for item in sys.argv[1:split]:
    target, value = item.split("=", 1)
    module, attr = target.split(":")
    mod = importlib.import_module(module)
    if not hasattr(mod, attr):
        raise SystemExit(f"knob_run: {module} has no attribute {attr}")
    setattr(mod, attr, ast.literal_eval(value))
    print(f"knob_run: {module}.{attr} = {getattr(mod, attr)!r}", file=sys.stderr)
sys.argv = sys.argv[split + 1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
