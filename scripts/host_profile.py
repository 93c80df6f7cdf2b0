"""Where the host time of PagedDecodePlan.run goes (CUDA): cProfile of many calls, plus the raw
C-launcher cost of the bound kernel. Diagnostic for docs/notes.md; not part of the test suite."""
import cProfile
import pstats
import time

import torch
import triton

from kvonce.bench.decode import Case, make_inputs
from kvonce.paged import PagedDecodePlan
from kvonce.kernels import _launch


def per_call(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


args = make_inputs(Case(64, 1024, 12, 2, "GQA 12/2"))
plan = PagedDecodePlan(*args, num_splits=1)
plan.run(*args)
print("hooks active:", _launch._knob_hooks_active(), "bound kernels:", len(_launch._compiled))
print(f"plan.run {per_call(lambda: plan.run(*args)):.1f} us")
(kernel, key, dev), (ck, tail) = next(iter(_launch._compiled.items()))
launch = next(iter(plan._launches.values()))
out = torch.empty_like(args[0])
full = (*args[:3], out, out, *args[3:], launch._scale, *launch._decode_ints, *tail)
grid = launch._decode_grid
s = torch._C._cuda_getCurrentRawStream(0)
print(f"ck.run alone {per_call(lambda: ck.run(*grid, s, ck.function, ck.packed_metadata, None, None, None, *full)):.1f} us")
print(f"torch.empty {per_call(lambda: torch.empty_like(out)):.1f} us")
print(f"stream {per_call(lambda: torch._C._cuda_getCurrentRawStream(0)):.2f} us")
print(f"alignment_key {per_call(lambda: _launch.alignment_key(*args)):.2f} us")
cProfile.run("for _ in range(3000): plan.run(*args)", "/tmp/p.out")
pstats.Stats("/tmp/p.out").sort_stats("tottime").print_stats(12)
