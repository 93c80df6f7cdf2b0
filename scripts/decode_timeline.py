"""When each paged-decode program starts and ends, on which SM: the decode kernel wrapped in a
kernel that reads ``%globaltimer`` and ``%smid`` around it (the library's kernel unchanged).

    PYTHONPATH=src python scripts/decode_timeline.py [--cases int4:32/8:1x131072,fp8:32/8:64x8192]
        [--splits 0] [--dtype fp16] [--raw DIR]

A case is FORMAT:HQ/HK:BATCHxLEN (FORMAT plain, fp8_e4m3, int8 or int4; d128, page 16, random page
order, q_len 1); ``--splits`` forces a split count (0: the plan's own). Per case, times in us from
the first program's start: the launch's span, the starts (p50 / max: programs that wait for a
free slot start late), the durations (min / p10 / p50 / p90 / max), the ends (min / p50 / max),
the mean busy share of the span over the SMs, and ``tail`` = span minus the p50 end (what the
last programs add). The question it answers (issue 26): is a short launch's time per program
(the 1 x 131072 rows) fixed cost inside each program, or slow programs at the end?

The combine kernel of a split launch is not in it (a separate launch). Eager launches, each
after a synchronize, the last of 5 kept. ``--raw DIR`` saves each case's [programs, 3] int64
table (start ns, end ns, SM).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

import kvonce  # noqa: E402
from kvonce.kernels import paged_decode as pd  # noqa: E402

_TEMPLATE = '''
import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer, smid
from kvonce.kernels.paged_decode import _paged_decode_kernel


@triton.jit
def timed_decode(Timeline, {params}):
    t0 = globaltimer()
    _paged_decode_kernel({args})
    t1 = globaltimer()
    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1)
                                                   + tl.num_programs(1) * tl.program_id(2))
    tl.store(Timeline + pid * 3, t0)
    tl.store(Timeline + pid * 3 + 1, t1)
    tl.store(Timeline + pid * 3 + 2, smid().to(tl.int64))
'''


def timed_kernel():
    """A JIT kernel ``timed_decode(Timeline, *decode args)`` (written to a file: Triton reads a
    kernel's source)."""
    params, args = [], []
    for p in pd._paged_decode_kernel.params:
        if p.is_constexpr:
            default = f" = {p.default!r}" if p.has_default else ""
            params.append(f"{p.name}: tl.constexpr{default}")
            args.append(f"{p.name}={p.name}")
        else:
            params.append(p.name)
            args.append(p.name)
    path = Path(tempfile.mkdtemp()) / "kvonce_timed_decode.py"
    path.write_text(_TEMPLATE.format(params=", ".join(params), args=", ".join(args)))
    spec = importlib.util.spec_from_file_location("kvonce_timed_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.timed_decode


class Recorder:
    """Replaces ``paged_decode.launch``: the decode kernel goes through ``timed_decode`` with a
    timeline of its grid's size; every other kernel (the combine) launches as before."""

    def __init__(self):
        self.kernel = timed_kernel()
        self.original = pd.launch
        self.timeline = None

    def __call__(self, kernel, key, grid, args, constexprs, num_warps, num_stages,
                 device_index, maxnreg=0):
        if kernel is not pd._paged_decode_kernel:
            return self.original(kernel, key, grid, args, constexprs, num_warps, num_stages,
                                 device_index, maxnreg)
        programs = grid[0] * grid[1] * grid[2]
        self.timeline = torch.zeros(programs, 3, dtype=torch.int64, device=args[0].device)
        options = {"maxnreg": maxnreg} if maxnreg else {}
        return self.kernel[grid](self.timeline, *args, **constexprs, num_warps=num_warps,
                                 num_stages=num_stages, **options)


def summary(table: torch.Tensor, num_sms: int) -> dict:
    start, end, sm = table[:, 0].double(), table[:, 1].double(), table[:, 2]
    t0 = start.min()
    start, end = (start - t0) / 1e3, (end - t0) / 1e3
    dur = end - start
    span = float(end.max())
    q = lambda x, f: float(torch.quantile(x, f))  # noqa: E731
    busy = torch.zeros(num_sms, dtype=torch.float64)
    for s in range(num_sms):  # union of each SM's program intervals
        mine = sm == s
        if mine.any():
            busy[s] = float(end[mine].max() - start[mine].min())
    return {"programs": table.shape[0], "span": span,
            "start p50/max": (q(start, 0.5), float(start.max())),
            "dur min/p10/p50/p90/max": (float(dur.min()), q(dur, 0.1), q(dur, 0.5), q(dur, 0.9),
                                        float(dur.max())),
            "end min/p50/max": (float(end.min()), q(end, 0.5), span),
            "sm busy": float(busy.mean()) / span, "tail": span - q(end, 0.5)}


def main() -> None:
    from decode_ncu_case import paged_case, parse_case

    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="int4:32/8:1x131072,int4:32/8:64x8192,fp8_e4m3:32/8:1x131072,"
                                      "int8:32/8:1x131072,plain:32/8:1x131072")
    p.add_argument("--splits", default="0", help="comma-separated forced counts (0: auto)")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--raw", default="")
    args = p.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    recorder = Recorder()
    pd.launch = recorder
    print(f"{torch.cuda.get_device_name()}, {args.dtype} q, us from the first program's start")
    for case in args.cases.split(","):
        fmt, hq, hk, batch, length = parse_case(case)
        q, kk, vv, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt, dtype)
        for splits in (int(s) for s in args.splits.split(",")):
            plan = kvonce.PagedDecodePlan(q, kk, vv, seqlens, table, num_splits=splits, **kw,
                                          kv_format="int4" if fmt == "int4" else None)
            for _ in range(5):
                torch.cuda.synchronize()
                plan.run(q, kk, vv, seqlens, table, **kw)
            torch.cuda.synchronize()
            tl = recorder.timeline.cpu()
            if args.raw:
                Path(args.raw).mkdir(parents=True, exist_ok=True)
                torch.save(tl, Path(args.raw) / f"{fmt}_{hq}-{hk}_{shape}_s{plan.num_splits}.pt")
            s = summary(tl, num_sms)
            fmt_t = lambda t: " / ".join(f"{x:.1f}" for x in t)  # noqa: E731
            print(f"{case} splits={plan.num_splits} programs={s['programs']} "
                  f"span {s['span']:.1f} | start {fmt_t(s['start p50/max'])} | dur "
                  f"{fmt_t(s['dur min/p10/p50/p90/max'])} | end {fmt_t(s['end min/p50/max'])} | "
                  f"sm busy {s['sm busy']:.2f} | tail {s['tail']:.1f}", flush=True)
        del q, kk, vv, table, seqlens, kw
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
