"""GPU check of the Gluon warp-specialized backward (kernels/gluon_bwd.py) on an H100.

    PYTHONPATH=src python scripts/gluon_bwd_gpu_check.py [--consan] [--no-bench] [--only N ...]
                                                         [--jobs 4]

1. Correctness: each case runs in its own subprocess (a crash must not lose the other cases);
   a watchdog reports the case as a HANG when the Gluon call has not returned in 45 s (a missing
   mbarrier expect or a wrong phase hangs silently). Per case: dq0, dq1, dk, dv from
   ``launch_gluon_bwd`` against ``launch_dual_group_bwd`` (kvonce's Triton backward) and against a
   float64 autograd reference (reference.dual_group_attention_ref in float64), relative error
   ||x - ref|| / ||ref||, every output pre-filled with NaN. PASS when the Gluon error against
   float64 is at most 2x the Triton backward's + 1e-3 (and below 0.05) and nothing is NaN.
2. Timing (do_bench median): the Llama-3-8B context-parallel cases of ``bench zigzag``
   (world 8, 32/8 heads, d128, bf16; 1x8192 at ranks 0, 3, 7 and the 8-sequence mixed batch at
   rank 3): Triton backward vs Gluon backward, ms and TFLOP/s (backward = 2.5x the forward FLOPs).
``--consan``: the correctness cases only, under TRITON_INSTRUMENTATION_MODE=consan.
``--variants a b ...`` (names of ``kernels.gluon_bwd_sched.VARIANTS``): each correctness case
checks every named schedule in its one subprocess (inputs, Triton and float64 gradients computed
once; a line names each variant before it runs, so a hang or crash shows whose it is).
scripts/gluon_bwd_sweep.py uses it and times the variants.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import _gpu_case_runner as runner

# (name, dtype, nheads, nheads_k, head_dim, causal, len_q0 per seq, len_q1 per seq, len_k per seq,
#  kv_end0 per seq, kv_end1 per seq). Small first.
CASES = [
    ("mha small noncausal", "bf16", 2, 2, 128, False, [64], [64], [128], [128], [128]),
    ("mha small causal", "bf16", 2, 2, 128, True, [64], [64], [128], [64], [128]),
    ("mha causal fp16", "fp16", 4, 4, 128, True, [128], [128], [256], [128], [256]),
    ("gqa 2/1 causal off-grid", "bf16", 2, 1, 128, True, [100], [77], [300], [150], [300]),
    ("gqa 32/8 causal", "bf16", 32, 8, 128, True, [256], [256], [1024], [512], [1024]),
    ("gqa 32/8 noncausal fp16", "fp16", 32, 8, 128, False, [200], [131], [333], [200], [333]),
    ("varlen + empty seq causal", "bf16", 4, 2, 128, True, [64, 0, 97, 130], [50, 0, 97, 3],
     [200, 0, 250, 389], [100, 0, 120, 389], [200, 0, 250, 389]),
    ("rows see no key (kv_end < len_q)", "bf16", 4, 4, 128, True, [128, 70], [90, 64],
     [256, 200], [30, 0], [256, 100]),
    ("varlen noncausal kv_end 0 group", "fp16", 8, 2, 128, False, [65, 129], [33, 64],
     [190, 257], [0, 257], [190, 100]),
    ("d64 gqa 4/1 causal", "bf16", 4, 1, 64, True, [192, 64], [192, 64], [384, 128],
     [192, 64], [384, 128]),
    ("d64 fp16 noncausal", "fp16", 8, 8, 64, False, [127], [129], [255], [255], [200]),
    ("zigzag-like 2048 gqa 32/8", "bf16", 32, 8, 128, True, [256], [256], [2048], [512], [2048]),
]


def _rel(x, ref) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def run_case(index: int, variants: tuple[str, ...] = ()) -> dict:
    """One case: the default Gluon schedule, or (``variants``) each named schedule, its result
    under ``row["variants"][name]``."""
    import torch

    from kvonce import fused_zigzag_llama3_flash_attn_varlen_forward as forward
    from kvonce.kernels.configs import get_dual_group_bwd_config
    from kvonce.kernels.dual_group_bwd import launch_dual_group_bwd
    from kvonce.kernels.gluon_bwd import launch_gluon_bwd
    from kvonce.kernels.gluon_bwd_sched import VARIANTS
    from kvonce.reference import dual_group_attention_ref

    import triton

    # Instrumented kernels (consan) keep their state in global scratch memory: give Triton an
    # allocator (the kernel itself needs none).
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    name, dt, h, hk, d, causal, l0, l1, lk, e0, e1 = CASES[index]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    dev = "cuda"
    torch.manual_seed(index)

    def cu(lens):
        return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32,
                            device=dev)

    cu0, cu1, cuk = cu(l0), cu(l1), cu(lk)
    q0 = torch.randn(sum(l0), h, d, device=dev, dtype=dtype)
    q1 = torch.randn(sum(l1), h, d, device=dev, dtype=dtype)
    k = torch.randn(sum(lk), hk, d, device=dev, dtype=dtype)
    v = torch.randn(sum(lk), hk, d, device=dev, dtype=dtype)
    end0 = torch.tensor(e0, dtype=torch.int32, device=dev)
    end1 = torch.tensor(e1, dtype=torch.int32, device=dev)
    scale = d ** -0.5
    # Under consan the forward takes pointer loads: ConSan reports "Deadlock detected" in the
    # software-pipelined TMA loop of the plain-Triton forward (2026-11-25, H100; that kernel
    # passes every GPU test), which would hide what the Gluon kernel does.
    fwd_config = None
    if os.environ.get("TRITON_INSTRUMENTATION_MODE") == "consan":
        from kvonce.kernels.configs import DualGroupFwdConfig

        fwd_config = DualGroupFwdConfig(128, 64, 8, 3)
    out0, out1, lse0, lse1 = forward(q0, q1, k, v, cu0, cu1, cuk, max(l0), max(l1), max(lk),
                                     end0, end1, softmax_scale=scale, causal=causal,
                                     config=fwd_config)
    do0 = torch.randn_like(out0)
    do1 = torch.randn_like(out1)

    # float64 reference by autograd.
    leaves = [t.detach().double().requires_grad_() for t in (q0, q1, k, v)]
    r0, r1, _, _ = dual_group_attention_ref(*leaves, cu0, cu1, cuk, end0, end1,
                                            softmax_scale=scale, causal=causal,
                                            compute_dtype=torch.float64)
    ref = torch.autograd.grad((r0, r1), leaves, (do0.double(), do1.double()),
                              allow_unused=True)
    ref = [torch.zeros_like(x) if g is None else g for g, x in zip(ref, leaves)]

    def grads(launch, **extra):
        dq0 = torch.full_like(q0, float("nan"))
        dq1 = torch.full_like(q1, float("nan"))
        dk = torch.full(k.shape, float("nan"), dtype=torch.float32, device=dev)
        dv = torch.full(v.shape, float("nan"), dtype=torch.float32, device=dev)
        delta0 = torch.full(lse0.shape, float("nan"), dtype=torch.float32, device=dev)
        delta1 = torch.full(lse1.shape, float("nan"), dtype=torch.float32, device=dev)
        launch(q0, q1, k, v, out0, out1, do0, do1, lse0, lse1, delta0, delta1, dq0, dq1, dk, dv,
               cu0, cu1, cuk, end0, end1, max_seqlen_q=max(max(l0), max(l1)),
               max_seqlen_k=max(lk), softmax_scale=scale, causal=causal, **extra)
        torch.cuda.synchronize()
        return dq0, dq1, dk, dv

    config = get_dual_group_bwd_config(torch.cuda.get_device_capability(), d, 2)
    triton_ = grads(launch_dual_group_bwd, config=config)   # compiles first, outside the watchdog

    def check(variant: str | None) -> dict:
        # A missing expect or a wrong phase hangs the GPU silently: report it as this case's
        # result (naming the variant).
        who = "launch_gluon_bwd" + (f" [{variant}]" if variant else "")
        watchdog = runner.start_hang_watchdog(name, who)
        t0 = time.time()
        gluon = grads(launch_gluon_bwd, **({} if variant is None else
                                           {"schedule": VARIANTS[variant]}))
        gluon_s = time.time() - t0
        watchdog.cancel()
        row = {"case": name, "gluon_first_call_s": round(gluon_s, 1)}
        ok = True
        for n, g, t, r in zip(("dq0", "dq1", "dk", "dv"), gluon, triton_, ref):
            nan = bool(torch.isnan(g).any().item())
            e_g, e_t, e_gt = _rel(g, r), _rel(t, r), _rel(g, t)
            row[n] = dict(gluon_vs_f64=e_g, triton_vs_f64=e_t, gluon_vs_triton=e_gt, nan=nan)
            ok &= not nan and e_g <= 2 * e_t + 1e-3 and e_g < 0.05
        row["pass"] = ok
        return row

    if not variants:
        return check(None)
    rows = {}
    for variant in variants:
        runner.announce_running(f"{name} [{variant}]")
        rows[variant] = check(variant)
    return {"case": name, "variants": rows, "pass": all(r["pass"] for r in rows.values())}


def _run_one(i: int, env: dict, timeout: float, variants: tuple[str, ...] = ()) -> dict:
    cmd = [sys.executable, __file__, "--case", str(i)]
    if variants:
        cmd += ["--variants", *variants]
    return runner.run_case_subprocess(cmd, CASES[i][0], env, timeout + 30 * len(variants),
                                      "TIMEOUT (hang: barrier phase/expect?)")


def correctness(only, consan: bool, jobs: int) -> list[dict]:
    """The cases in ``jobs`` concurrent subprocesses, printed in order."""
    env = dict(os.environ)
    if consan:
        env["TRITON_INSTRUMENTATION_MODE"] = "consan"
    indices = [i for i in range(len(CASES)) if only is None or i in only]
    timeout = runner.CASE_TIMEOUT_S * (2 if consan else 1)

    def print_errors(row: dict) -> None:
        for n in ("dq0", "dq1", "dk", "dv"):
            e = row[n]
            print(f"    {n}: gluon {e['gluon_vs_f64']:.2e}  triton {e['triton_vs_f64']:.2e}  "
                  f"gluon-vs-triton {e['gluon_vs_triton']:.2e}  nan={e['nan']}", flush=True)

    return runner.run_cases(lambda i: _run_one(i, env, timeout), indices, jobs, print_errors)


def bench() -> list[dict]:
    import torch
    import triton

    from kvonce import fused_zigzag_llama3_flash_attn_varlen_forward as forward
    from kvonce.bench import zigzag as zb
    from kvonce.kernels.configs import get_dual_group_bwd_config
    from kvonce.kernels.dual_group_bwd import launch_dual_group_bwd
    from kvonce.kernels.gluon_bwd import launch_gluon_bwd

    wanted = {"llama3-8B 1x8192 w8 r0", "llama3-8B 1x8192 w8 r3", "llama3-8B 1x8192 w8 r7",
              "llama3-8B 8 mixed w8 r3"}
    rows = []
    for case in zb.cases("bf16"):
        if case.name not in wanted:
            continue
        s = zb.setup(case, torch.bfloat16)
        (q0, q1, k, v), meta = zb._fused_args(case, s)
        cu0, cu1, cuk, mq0, mq1, mk, end0, end1 = meta
        scale = case.head_dim ** -0.5
        out0, out1, lse0, lse1 = forward(q0, q1, k, v, *meta, softmax_scale=scale)
        do0, do1 = torch.randn_like(out0), torch.randn_like(out1)
        config = get_dual_group_bwd_config(torch.cuda.get_device_capability(), case.head_dim, 2)
        bufs = dict(dq0=torch.empty_like(q0), dq1=torch.empty_like(q1),
                    dk=torch.empty(k.shape, dtype=torch.float32, device=k.device),
                    dv=torch.empty(v.shape, dtype=torch.float32, device=v.device),
                    delta0=torch.empty_like(lse0), delta1=torch.empty_like(lse1))

        def call(launch, **extra):
            return lambda: launch(q0, q1, k, v, out0, out1, do0, do1, lse0, lse1,
                                  bufs["delta0"], bufs["delta1"], bufs["dq0"], bufs["dq1"],
                                  bufs["dk"], bufs["dv"], cu0, cu1, cuk, end0, end1,
                                  max_seqlen_q=max(mq0, mq1), max_seqlen_k=mk,
                                  softmax_scale=scale, causal=True, **extra)

        flops = zb.BWD_FLOP_FACTOR * s["flops"]
        row = {"case": case.name}
        for name, fn in (("triton", call(launch_dual_group_bwd, config=config)),
                         ("gluon", call(launch_gluon_bwd))):
            try:
                ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
                row[name] = (ms, flops / ms / 1e9)
            except Exception as exc:  # report and go on to the next path
                row[name] = (float("nan"), float("nan"))
                print(f"{case.name} {name}: {type(exc).__name__}: {exc}", flush=True)
        rows.append(row)
        print(row, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--only", type=int, nargs="*", help="correctness case indices")
    parser.add_argument("--consan", action="store_true",
                        help="correctness cases under TRITON_INSTRUMENTATION_MODE=consan")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--jobs", type=int, default=4, help="correctness cases run at once")
    parser.add_argument("--variants", nargs="*", default=(),
                        help="with --case: check these gluon_bwd_sched.VARIANTS")
    args = parser.parse_args()
    if args.case is not None:
        runner.print_result_line(run_case(args.case, tuple(args.variants)))
        return 0
    cases = correctness(args.only if args.only else None, args.consan, args.jobs)
    crashed = [r["case"] for r in cases if "error" in r]
    if crashed and not (args.consan or args.no_bench):
        print(f"timing skipped: {len(crashed)} case(s) crashed or hung ({crashed})")
    timing = [] if (args.consan or args.no_bench or crashed) else bench()
    print("\n| case | result | dq0 | dq1 | dk | dv | (gluon rel. err. vs float64) |")
    print("|---|---|---|---|---|---|---|")
    for r in cases:
        errs = ["-"] * 4 if "error" in r else [f"{r[n]['gluon_vs_f64']:.1e}"
                                               for n in ("dq0", "dq1", "dk", "dv")]
        print(f"| {r['case']} | {'PASS' if r['pass'] else 'FAIL'} | " + " | ".join(errs) + " | |")
    if timing:
        print("\n| bench case (bf16, causal) | triton ms | triton TFLOP/s | gluon ms | gluon TFLOP/s |")
        print("|---|---|---|---|---|")
        for r in timing:
            print(f"| {r['case']} | {r['triton'][0]:.2f} | {r['triton'][1]:.0f} | "
                  f"{r['gluon'][0]:.2f} | {r['gluon'][1]:.0f} |")
    return 0 if all(r["pass"] for r in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
