"""Whether this Triton's Gluon can move data between the CTAs of a cluster (CPU only: compiles
for sm_90a, runs nothing). The GQA 12/2 decode's design (issue 26) merges two splits of a
(sequence, KV head) through distributed shared memory; Gluon's ``num_ctas`` with a layout's
``cga_layout`` is the way there. Two kernels on a 2-CTA cluster: a cross-CTA ``convert_layout``
(DSMEM) and a cross-CTA ``gl.sum``. Triton 3.6 (2026-12-01): the convert fails in
ConvertTritonGPUToLLVM ("'nvvm.mapa' op result #0 must be LLVM pointer in address space 0 or
... 7, but got '!llvm.ptr<3>'"), the sum asserts ``isReduceWithinCTA``.

    .venv/bin/python scripts/gluon_cluster_probe.py
"""
import os
import re
import subprocess
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

SPLIT = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[1]]))   # CTA 1: the top
WHOLE = gl.constexpr(gl.BlockedLayout([2], [32], [4], [0], cga_layout=[[0]]))   # each CTA: all


@gluon.jit
def _cross_cta_convert(X, Y):
    x = gl.load(X + gl.arange(0, 256, SPLIT))
    gl.store(Y + gl.arange(0, 256, WHOLE), gl.convert_layout(x, WHOLE))


@gluon.jit
def _cross_cta_sum(X, Y):
    offs = gl.arange(0, 256, SPLIT)
    x = gl.load(X + offs)
    gl.store(Y + offs, x + gl.sum(x, 0))


def _compile(name: str) -> str:
    """Compile one kernel in a fresh process (an LLVM assertion aborts the process)."""
    code = f"""
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
import gluon_cluster_probe as m
src = gluon._runtime.GluonASTSource(fn=m.{name}, signature={{"X": "*fp32", "Y": "*fp32"}},
                                    constexprs={{}})
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                     options=dict(num_warps=4, num_ctas=2)).asm["ptx"]
print("compiled;", "mapa", ptx.count("mapa"), "shared::cluster", ptx.count("shared::cluster"))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    if proc.returncode == 0:
        return proc.stdout.strip()
    errors = [line for line in (proc.stderr + proc.stdout).splitlines()
              if re.search(r"error:|Assertion", line)]
    return "failed: " + (errors[0].strip()[:300] if errors else proc.stderr.strip()[-300:])


if __name__ == "__main__":
    for kernel in ("_cross_cta_convert", "_cross_cta_sum"):
        print(f"{kernel}: {_compile(kernel)}")
