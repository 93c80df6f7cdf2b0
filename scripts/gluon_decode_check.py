"""GPU check of the Gluon fp8 paged decode (``kvonce/kernels/gluon_decode.py``): correctness
against a float32 reference, then its speed against the Triton path (``kvonce.paged_attention``
on the same fp8 cache). Hopper only (TMA, sm_90a).

    .venv/bin/python scripts/gluon_decode_check.py [--skip-bench] [--skip-correctness]
        [--variants 1cta-4st,2cta-3st,2cta-2st] [--shapes 12/2:128x512,32/8:1x131072:33/66]

(a) Correctness: the caches quantized with ``kvonce.paged.quant.quantize_kv`` (per-KV-head fp8
scales), the reference plain float32 softmax attention over the dequantized keys (one sequence
at a time); the Gluon partials merged by ``paged_combine._combine_splits_kernel``
(``gluon_decode.combine_partials``). Random block tables (pages in random order); the slots past
each sequence's end in its last page, and a spare page every block-table entry past the
sequence's pages points at, hold NaN bytes (0x7F), which must never reach the output. The max
abs error of the fp16 output must be < 2e-2, of the LSE < 1e-2 (num_splits 1: the partial
itself is checked too). Causal rows that see no key (q_len > seqlen) must give out 0, LSE -inf
(the reference gives that too; a plain softmax's NaN there read as "err inf" before). Then the
speed part's own batch-64 data at full size (64 x 8192, random fp8 bytes: outputs up to ~200,
where an fp16 ulp is 0.06-0.12), checked to ``REL_TOL`` x max |ref|, with the Triton path's error
beside it.

(b) Speed at the ``bench quant`` shapes (GQA 32/8 and MHA 12/12, 64 x 8192 and 1 x 131072; fp8
cache of random bytes, fp16 q, page 16, random page order, causal q_len 1): the Triton path
(``PagedDecodePlan.run``) and the Gluon decode + combine (``GluonDecodeLaunch``: descriptors and
buffers made once), each timed as CUDA-graph replays (``do_bench_cudagraph``, median: no host
launch cost, which eager ``do_bench`` adds to a short kernel), the Gluon decode kernel alone
too, and eagerly at the plan's split count. An A/B of ``VARIANTS`` (``--variants``): 1cta-4st
(the 2026-11-27 kernel, one CTA an SM) against 2cta-3st / 2cta-2st (launched at 128 registers,
consumers at 232 after setmaxnreg, the merge through the K ring: two CTAs an SM), back to back
at the plan's split count and at whole waves of two CTAs an SM (``BENCH_SHAPES``). Effective
bandwidth = K + V bytes / time.

(0) First, every variant (and ``OCCUPANCY_ONLY``'s) is launched once and the driver asked for its
launch registers, static / dynamic shared memory and CTAs an SM
(``cuOccupancyMaxActiveBlocksPerMultiprocessor``); a timed variant that does not fit its CTAs
an SM fails the run. (a2) checks the 2-CTA variants (and the ring merge at one CTA) on the
correctness cases.

Everything printed also goes to ``$OUT/gluon_decode.txt`` when ``OUT`` is set. Each part is
wrapped so that one failure prints its traceback and the rest still runs; exit status 1 if any
check failed or raised.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

LINES: list[str] = []
FAILURES: list[str] = []


def log(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LINES.append(line)
    out = os.environ.get("OUT")
    if out:
        try:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "gluon_decode.txt").write_text("\n".join(LINES) + "\n")
        except OSError:
            pass


def guarded(name: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001  (a failing part must not hide the others)
        FAILURES.append(name)
        log(f"EXCEPTION in {name}:\n{traceback.format_exc()}")
        return None


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------

NAN_BYTE = 0x7F   # e4m3fn NaN


def make_cache(seqlens, nheads_k, page_size, device, gen, *, quantized_from_float=True,
               poison=True):
    """fp8 caches with random page order: ``(k_q, v_q, k_scale, v_scale, block_table)``.
    Pages past each sequence's own point at a spare page of NaN bytes; the slots past the end in
    a sequence's last page hold NaN bytes too (``poison``)."""
    from kvonce.paged.quant import quantize_kv

    pages = [max(1, -(-int(n) // page_size)) for n in seqlens]
    max_pages = max(pages) + 1
    num_pages = sum(pages) + 1                    # + the spare NaN page
    spare = num_pages - 1
    perm = torch.randperm(num_pages - 1, generator=gen).tolist()
    table = torch.full((len(seqlens), max_pages), spare, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = torch.tensor(perm[at:at + n], dtype=torch.int32)
        at += n
    shape = (num_pages, page_size, nheads_k, 128)
    if quantized_from_float:
        # Per-head magnitudes differ (so the per-head scales matter), a few outliers.
        mag = torch.linspace(0.5, 3.0, nheads_k)[None, None, :, None]
        k = (torch.randn(shape, generator=gen) * mag).to(device)
        v = (torch.randn(shape, generator=gen) * mag.flip(2)).to(device)
        k_q, k_scale = quantize_kv(k, "fp8_e4m3")
        v_q, v_scale = quantize_kv(v, "fp8_e4m3")
        del k, v
    else:   # big timing caches: random finite bytes straight on the device
        def rand_fp8():
            b = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
            b[(b & 0x7F) == NAN_BYTE] = 0x38
            return b.view(torch.float8_e4m3fn)
        k_q, v_q = rand_fp8(), rand_fp8()
        k_scale = torch.full((nheads_k,), 0.02, dtype=torch.float32, device=device)
        v_scale = torch.full((nheads_k,), 0.5, dtype=torch.float32, device=device)
    if poison:
        kb, vb = k_q.view(torch.uint8), v_q.view(torch.uint8)
        kb[spare] = NAN_BYTE
        vb[spare] = NAN_BYTE
        for b, n in enumerate(seqlens):
            n = int(n)
            last = int(table[b, pages[b] - 1])
            first_free = n - (pages[b] - 1) * page_size
            if 0 <= first_free < page_size:
                kb[last, first_free:] = NAN_BYTE
                vb[last, first_free:] = NAN_BYTE
    return k_q, v_q, k_scale, v_scale, table.to(device)


def reference(q, k_q, v_q, k_scale, v_scale, seqlens, table, softmax_scale, causal):
    """float32 attention over the dequantized caches (``dequantize_kv``'s arithmetic: fp8 value
    x its head's scale), one sequence at a time (only its keys are dequantized, so a 64 x 8192
    batch needs ~100 MB at a time): ``(out [b, t, h, d], lse [b, t, h])``. A row that sees no
    key (causal, q_len > seqlen: row t sees keys j <= t + seqlen - q_len) gets out 0, lse -inf,
    the kernels' contract (``PagedDecodePlan.run``); a plain softmax would give NaN there."""
    batch, q_len, nheads, d = q.shape
    page_size, nheads_k = k_q.shape[1], k_q.shape[2]
    group = nheads // nheads_k
    k_s = (k_scale if k_scale.dim() == 0 else k_scale[:, None]).float()
    v_s = (v_scale if v_scale.dim() == 0 else v_scale[:, None]).float()
    k_rows = k_q.view(torch.uint8).view(-1, nheads_k, d)      # (uint8: gathers any dtype)
    v_rows = v_q.view(torch.uint8).view(-1, nheads_k, d)
    out = torch.zeros(batch, q_len, nheads, d, dtype=torch.float32, device=q.device)
    lse = torch.full((batch, q_len, nheads), float("-inf"), dtype=torch.float32,
                     device=q.device)
    for b, n in enumerate(seqlens):
        n = int(n)
        if n == 0:
            continue
        pos = torch.arange(n, device=q.device)
        rows = table[b].long()[pos // page_size] * page_size + pos % page_size
        k = k_rows[rows].view(k_q.dtype).float() * k_s          # [n, hk, d]
        v = v_rows[rows].view(v_q.dtype).float() * v_s
        qb = q[b].float().reshape(q_len, nheads_k, group, d)
        s = torch.einsum("tkgd,nkd->kgtn", qb, k) * softmax_scale      # [hk, g, t, n]
        if causal:
            t = torch.arange(q_len, device=q.device)[:, None]
            visible = pos[None, :] <= t + n - q_len
            s = s.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)                            # [hk, g, t]
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)           # no-key rows: 0
        o = torch.einsum("kgtn,nkd->tkgd", p, v)
        out[b] = o.reshape(q_len, nheads, d)
        lse[b] = row_lse.permute(2, 0, 1).reshape(q_len, nheads)
        del k, v, s, p
    return out, lse


def run_gluon(q, k_q, v_q, k_scale, v_scale, seqlens_t, table, softmax_scale, num_splits,
              causal, stages=4, thread_arrive=True, ctas_per_sm=1, ring_merge=False):
    """Gluon decode + combine: ``(out fp16 [b, t, h, d], lse [b, h, t], out_partial,
    lse_partial)``."""
    from kvonce.kernels.gluon_decode import GluonDecodeLaunch

    batch, q_len, nheads, d = q.shape
    o_part = torch.empty(batch, q_len, nheads, num_splits, d, dtype=torch.float32,
                         device=q.device)
    l_part = torch.empty(batch, q_len, nheads, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    lse = torch.empty(batch, nheads, q_len, dtype=torch.float32, device=q.device)
    GluonDecodeLaunch(q, k_q, v_q, k_scale, v_scale, seqlens_t, table, o_part, l_part, out, lse,
                      softmax_scale=softmax_scale, num_splits=num_splits, causal=causal,
                      stages=stages, thread_arrive=thread_arrive, ctas_per_sm=ctas_per_sm,
                      ring_merge=ring_merge)()
    return out, lse, o_part, l_part


# ----------------------------------------------------------------------------------------------
# (a) correctness
# ----------------------------------------------------------------------------------------------

def max_err(a, b) -> float:
    """max |a - b| over finite reference entries; inf if a has a non-finite where b is finite."""
    a, b = a.float(), b.float()
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    diff = (a - b).abs()
    diff = torch.where(both_inf, torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    return float(diff.max()) if diff.numel() else 0.0


def fp16_ulp(x: float) -> float:
    """The fp16 spacing at magnitude ``x`` (normal range)."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 2.0 ** -14))) - 10)


REL_TOL = 4e-3   # bench data: max |out - ref| <= REL_TOL * max |ref| (>= 4 fp16 ulps there)

# The A/B: GluonDecodeLaunch options. 1cta-4st is the kernel measured on 2026-11-27 (255 launch
# registers: one CTA an SM); the 2cta ones launch at TWO_CTA_MAXNREG = 128 registers (consumers
# setmaxnreg 232) with the merge through the idle K ring (98684 B at 3 stages, 65860 B at 2).
VARIANTS = {
    "1cta-4st": dict(stages=4),
    "2cta-3st": dict(stages=3, ctas_per_sm=2, ring_merge=True),
    "2cta-2st": dict(stages=2, ctas_per_sm=2, ring_merge=True),
}
# Compiled and their occupancy read, not timed: the 1-CTA 3-stage form, the ring merge alone,
# and the 2-CTA registers with the reduce-scratch merge (114812 B: two CTAs only if the 1 KB a
# CTA that cuobjdump shows as static shared memory is the driver's reserve, counted once).
OCCUPANCY_ONLY = {
    "1cta-3st": dict(stages=3),
    "1cta-4st-ring": dict(stages=4, ring_merge=True),
    "2cta-3st-scratch": dict(stages=3, ctas_per_sm=2),
}


def check_case(name, *, seqlens, nheads, nheads_k, q_len=1, page_size=16, num_splits=1,
               causal=True, stages=4, thread_arrive=True, ctas_per_sm=1, ring_merge=False,
               seed=0, also_triton=False, bench_data=False):
    """One case against ``reference``. ``bench_data``: the speed part's caches (random fp8
    bytes, k_scale 0.02, v_scale 0.5: heavy-tailed values, outputs up to ~200, where one fp16
    ulp is 0.0625-0.125), checked relative to the largest output (REL_TOL); otherwise caches
    quantized from normal floats, checked to 2e-2 absolute. Rows that see no key (causal,
    q_len > seqlen) must come out exactly 0 with LSE -inf."""
    import kvonce

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)          # bench_data's bytes are drawn on the device
    k_q, v_q, k_scale, v_scale, table = make_cache(seqlens, nheads_k, page_size, device, gen,
                                                   quantized_from_float=not bench_data)
    batch = len(seqlens)
    q = torch.randn(batch, q_len, nheads, 128, generator=gen).to(device, torch.float16)
    seqlens_t = torch.tensor(seqlens, dtype=torch.int32, device=device)
    scale = 128 ** -0.5
    ref_out, ref_lse = reference(q, k_q, v_q, k_scale, v_scale, seqlens, table, scale, causal)
    out, lse, o_part, l_part = run_gluon(q, k_q, v_q, k_scale, v_scale, seqlens_t, table, scale,
                                         num_splits, causal, stages, thread_arrive, ctas_per_sm,
                                         ring_merge)
    torch.cuda.synchronize()
    ref_max = float(ref_out.abs().max()) if ref_out.numel() else 0.0
    tol_o = REL_TOL * ref_max if bench_data else 2e-2
    err_o = max_err(out, ref_out)
    err_l = max_err(lse.transpose(1, 2), ref_lse)
    extra = ""
    ok = err_o < tol_o and err_l < 1e-2
    if bench_data:
        extra += (f" (max|ref| {ref_max:.1f}, fp16 ulp there {fp16_ulp(ref_max):.3g}: err "
                  f"{err_o / fp16_ulp(ref_max):.2f} ulp, tol {tol_o:.2e})")
    if num_splits == 1:
        err_p = max_err(o_part[:, :, :, 0], ref_out)
        err_pl = max_err(l_part[:, :, :, 0], ref_lse)
        extra += f" partial {err_p:.2e}/{err_pl:.2e}"
        ok = ok and err_p < tol_o and err_pl < 1e-2
    no_key = torch.isneginf(ref_lse)                       # [b, t, h]
    if bool(no_key.any()):
        zero = bool((out.float()[no_key] == 0).all()) and bool(
            torch.isneginf(lse.transpose(1, 2)[no_key]).all())
        extra += f" no-key rows {int(no_key.sum())}: out 0 & lse -inf there {zero}"
        ok = ok and zero
    if also_triton:
        t_out = kvonce.paged_attention(q, k_q, v_q, seqlens_t, table, causal=causal,
                                       k_scale=k_scale, v_scale=v_scale)
        extra += (f" (triton path vs ref {max_err(t_out, ref_out):.2e}, |gluon - triton| "
                  f"{max_err(out, t_out):.2e})")
    status = "ok" if ok else "FAIL"
    log(f"  {status:4s} {name}: out max err {err_o:.2e}, lse max err {err_l:.2e}{extra}")
    if not ok:
        FAILURES.append(name)
    del k_q, v_q, ref_out, out, o_part
    torch.cuda.empty_cache()


def correctness() -> None:
    log("== (a) correctness vs float32 reference (fp8 e4m3 cache, fp16 q)")
    seqlens = [1, 200, 1000]
    for nh, nhk in ((12, 12), (32, 8)):
        for splits in (1, 4):
            name = f"b3 seqlens {seqlens} {nh}/{nhk} q_len1 page16 splits{splits}"
            guarded(name, check_case, name, seqlens=seqlens, nheads=nh, nheads_k=nhk,
                    num_splits=splits, also_triton=splits == 1)
    more = [
        ("GQA 32/8 splits4 stages3", dict(nheads=32, nheads_k=8, num_splits=4, stages=3)),
        ("GQA 32/8 splits4 elected arrive", dict(nheads=32, nheads_k=8, num_splits=4,
                                                 thread_arrive=False)),
        ("GQA 32/8 page64 splits2", dict(nheads=32, nheads_k=8, num_splits=2, page_size=64)),
        ("MHA 12/12 page48 splits3", dict(nheads=12, nheads_k=12, num_splits=3, page_size=48)),
        ("GQA 32/8 page256 splits1", dict(nheads=32, nheads_k=8, page_size=256)),
        # seqlen 1 < q_len: the first causal rows of sequence 0 see no key (out 0, lse -inf)
        ("GQA 32/8 q_len2 causal splits4", dict(nheads=32, nheads_k=8, q_len=2, num_splits=4,
                                                also_triton=True)),
        ("GQA 32/8 q_len3 causal splits1", dict(nheads=32, nheads_k=8, q_len=3,
                                                also_triton=True)),
        ("MHA 12/12 q_len4 causal splits3 stages3", dict(nheads=12, nheads_k=12, q_len=4,
                                                         num_splits=3, stages=3)),
        ("GQA 32/8 q_len2 non-causal splits2", dict(nheads=32, nheads_k=8, q_len=2,
                                                    num_splits=2, causal=False)),
        ("GQA 16/1 (group 16) splits4", dict(nheads=16, nheads_k=1, num_splits=4)),
    ]
    for name, kw in more:
        guarded(name, check_case, name, seqlens=[1, 200, 1000, 129, 4097], seed=1, **kw)
    # a long sequence, many splits (the bench's regime)
    name = "b2 seqlens [20000, 131] GQA 32/8 splits 33"
    guarded(name, check_case, name, seqlens=[20000, 131], nheads=32, nheads_k=8, num_splits=33,
            seed=2)
    # The speed part's batch-64 shapes and data (random fp8 bytes): caches of 0.5 / 2.1 GB
    # (rows num_pages * 16 = 524304), block-table rows of 513 entries, 64 sequences' partials.
    for name, nh, nhk, splits in (("bench data 64x8192 GQA 32/8 splits2", 32, 8, 2),
                                  ("bench data 64x8192 MHA 32/32 splits1", 32, 32, 1),
                                  ("bench data 64x8192 MHA 12/12 splits1", 12, 12, 1)):
        guarded(name, check_case, name, seqlens=[8192] * 64, nheads=nh, nheads_k=nhk,
                num_splits=splits, seed=3, also_triton=True, bench_data=True)
    correctness_variants()


def correctness_variants() -> None:
    """The two-CTA variants (and the ring merge at one CTA) on the cases above."""
    log("== (a2) correctness of the 2-CTA variants (maxnreg 128, merge through the K ring)")
    seqlens = [1, 200, 1000]
    for vname in ("2cta-3st", "2cta-2st"):
        for nh, nhk in ((12, 12), (32, 8)):
            for splits in (1, 4):
                name = f"{vname} b3 seqlens {seqlens} {nh}/{nhk} q_len1 page16 splits{splits}"
                guarded(name, check_case, name, seqlens=seqlens, nheads=nh, nheads_k=nhk,
                        num_splits=splits, **VARIANTS[vname])
    more = [
        ("2cta-3st", "GQA 32/8 page64 splits2", dict(nheads=32, nheads_k=8, num_splits=2,
                                                     page_size=64)),
        ("2cta-3st", "MHA 12/12 page48 splits3", dict(nheads=12, nheads_k=12, num_splits=3,
                                                      page_size=48)),
        ("2cta-3st", "GQA 32/8 page256 splits1", dict(nheads=32, nheads_k=8, page_size=256)),
        ("2cta-3st", "GQA 32/8 q_len2 causal splits4", dict(nheads=32, nheads_k=8, q_len=2,
                                                            num_splits=4)),
        ("2cta-3st", "GQA 32/8 q_len3 causal splits1", dict(nheads=32, nheads_k=8, q_len=3)),
        ("2cta-3st", "MHA 12/12 q_len4 causal splits3", dict(nheads=12, nheads_k=12, q_len=4,
                                                             num_splits=3)),
        ("2cta-3st", "GQA 32/8 q_len2 non-causal splits2", dict(nheads=32, nheads_k=8,
                                                                q_len=2, num_splits=2,
                                                                causal=False)),
        ("2cta-3st", "GQA 16/1 (group 16) splits4", dict(nheads=16, nheads_k=1, num_splits=4)),
        ("2cta-2st", "GQA 32/8 q_len2 causal splits4", dict(nheads=32, nheads_k=8, q_len=2,
                                                            num_splits=4)),
        ("2cta-2st", "GQA 16/1 (group 16) page48 splits3", dict(nheads=16, nheads_k=1,
                                                                num_splits=3, page_size=48)),
        ("1cta-4st-ring", "GQA 32/8 splits4", dict(nheads=32, nheads_k=8, num_splits=4)),
        ("1cta-4st-ring", "MHA 12/12 q_len4 causal splits3", dict(nheads=12, nheads_k=12,
                                                                  q_len=4, num_splits=3)),
    ]
    for vname, case, kw in more:
        name = f"{vname} {case}"
        opts = {**VARIANTS, **OCCUPANCY_ONLY}[vname]
        guarded(name, check_case, name, seqlens=[1, 200, 1000, 129, 4097], seed=1, **opts, **kw)
    for vname in ("2cta-3st", "2cta-2st"):
        name = f"{vname} b2 seqlens [20000, 131] GQA 32/8 splits 66"
        guarded(name, check_case, name, seqlens=[20000, 131], nheads=32, nheads_k=8,
                num_splits=66, seed=2, **VARIANTS[vname])
    name = "2cta-3st bench data 64x8192 GQA 32/8 splits2"
    guarded(name, check_case, name, seqlens=[8192] * 64, nheads=32, nheads_k=8, num_splits=2,
            seed=3, bench_data=True, **VARIANTS["2cta-3st"])


# ----------------------------------------------------------------------------------------------
# (b) speed
# ----------------------------------------------------------------------------------------------

def peak_bandwidth() -> float | None:
    name = torch.cuda.get_device_name()
    if "H200" in name:
        return 4.8e12
    if "H100" in name and ("SXM" in name or "HBM3" in name):
        return 3.35e12
    if "H100" in name:
        return 2.0e12 if "PCIe" in name else 3.35e12
    return None


def graph_us(fn) -> float:
    """Median time of ``fn`` replayed from a CUDA graph (``do_bench_cudagraph``: the calls
    captured back to back, so no host launch cost), us."""
    import triton

    try:
        return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
    except Exception:  # noqa: BLE001  (report it, keep the eager numbers)
        FAILURES.append("cuda graph timing")
        log(f"EXCEPTION in do_bench_cudagraph:\n{traceback.format_exc()}")
        torch.cuda.synchronize()
        return float("nan")


def eager_us(fn) -> float:
    """Median of ``do_bench`` (eager launches, L2 flushed between calls), us."""
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3


def _cuda():
    import ctypes

    return ctypes, ctypes.CDLL("libcuda.so.1")


def device_limits() -> dict:
    """The driver's shared memory and register limits of the current device."""
    ctypes, lib = _cuda()
    dev = ctypes.c_int(0)
    lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(torch.cuda.current_device()))
    out = {}
    for name, attr in (("smem_per_sm", 81), ("smem_per_block_optin", 97),
                       ("reserved_smem_per_block", 111), ("regs_per_sm", 82), ("sms", 16)):
        v = ctypes.c_int(0)
        rc = lib.cuDeviceGetAttribute(ctypes.byref(v), ctypes.c_int(attr), dev)
        out[name] = v.value if rc == 0 else f"err {rc}"
    return out


def occupancy(kernel) -> dict:
    """A loaded CompiledKernel's launch registers, shared memory and CTAs an SM, from the
    driver (``cuFuncGetAttribute``, ``cuOccupancyMaxActiveBlocksPerMultiprocessor``)."""
    ctypes, lib = _cuda()
    kernel._init_handles()
    fn = ctypes.c_void_p(kernel.function)

    def attr(a):
        v = ctypes.c_int(0)
        rc = lib.cuFuncGetAttribute(ctypes.byref(v), ctypes.c_int(a), fn)
        return v.value if rc == 0 else f"err {rc}"

    threads = kernel.metadata.num_warps * 32
    n = ctypes.c_int(0)
    rc = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(n), fn, ctypes.c_int(threads), ctypes.c_size_t(kernel.metadata.shared))
    return dict(threads=threads, regs=attr(4), spills=kernel.n_spills, static_smem=attr(1),
                dyn_smem=kernel.metadata.shared, max_dyn_smem=attr(8),
                ctas_per_sm=n.value if rc == 0 else f"err {rc}")


OCCUPANCY: dict = {}   # variant -> occupancy(), filled by occupancy_check


def occupancy_check() -> None:
    """Every variant launched once (GQA 32/8, 2 x 1000 keys) and the driver asked how many
    CTAs an SM it fits; the 2-CTA variants that the A/B times must fit two."""
    from kvonce.kernels.gluon_decode import GluonDecodeLaunch

    log("== occupancy (driver): " + ", ".join(f"{k} {v}" for k, v in device_limits().items()))
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(4)
    seqlens = [1000, 1000]
    k_q, v_q, k_scale, v_scale, table = make_cache(seqlens, 8, 16, device, gen)
    q = torch.randn(2, 1, 32, 128, generator=gen).to(device, torch.float16)
    seqlens_t = torch.tensor(seqlens, dtype=torch.int32, device=device)
    o_part = torch.empty(2, 1, 32, 4, 128, dtype=torch.float32, device=device)
    l_part = torch.empty(2, 1, 32, 4, dtype=torch.float32, device=device)
    for vname, opts in {**VARIANTS, **OCCUPANCY_ONLY}.items():
        kernel = GluonDecodeLaunch(q, k_q, v_q, k_scale, v_scale, seqlens_t, table, o_part,
                                   l_part, softmax_scale=128 ** -0.5, num_splits=4, causal=True,
                                   **opts).decode()
        torch.cuda.synchronize()
        occ = occupancy(kernel)
        OCCUPANCY[vname] = occ
        log(f"  {vname} {opts}: " + ", ".join(f"{k} {v}" for k, v in occ.items()))
        if vname in VARIANTS and occ["ctas_per_sm"] != opts.get("ctas_per_sm", 1):
            FAILURES.append(f"occupancy {vname}: {occ['ctas_per_sm']} CTAs an SM, expected "
                            f"{opts.get('ctas_per_sm', 1)}")
            log(f"  FAIL {vname}: {occ['ctas_per_sm']} CTAs an SM")


def bench_shape(label, batch, seqlen, nheads, nheads_k, sweep, rows, variants):
    """The Triton plan, then every variant at the plan's split count and each of ``sweep``
    (variants back to back at each split count)."""
    import kvonce  # noqa: F401  (registers the ops)
    from kvonce.kernels.gluon_decode import GluonDecodeLaunch
    from kvonce.paged.decode import PagedDecodePlan

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    seqlens = [seqlen] * batch
    k_q, v_q, k_scale, v_scale, table = make_cache(seqlens, nheads_k, 16, device, gen,
                                                   quantized_from_float=False, poison=False)
    q = torch.randn(batch, 1, nheads, 128, generator=gen).to(device, torch.float16)
    seqlens_t = torch.tensor(seqlens, dtype=torch.int32, device=device)
    scale = 128 ** -0.5
    # The Triton kernel's plan (the fp8 row with its Gluon launch off: the row took it on
    # 2026-11-29), at the Triton rule's split count.
    from kvonce.kernels.configs import get_paged_decode_config
    row = get_paged_decode_config(torch.cuda.get_device_capability(device), 128, "fp8_e4m3", 2)
    plan = PagedDecodePlan(q, k_q, v_q, seqlens_t, table, k_scale=k_scale, v_scale=v_scale,
                           causal=True, config=dataclasses.replace(row, gluon=False))
    plan_splits = plan.num_splits
    kv_bytes = 2 * batch * seqlen * nheads_k * 128
    peak = peak_bandwidth()
    sms = torch.cuda.get_device_properties(device).multi_processor_count

    def fmt(us):
        tbs = kv_bytes / (us * 1e-6) / 1e12
        pct = f" {100 * tbs * 1e12 / peak:3.0f}%" if peak else ""
        return f"{us:7.1f} us {tbs:4.2f} TB/s{pct}"

    def triton_call():
        return plan.run(q, k_q, v_q, seqlens_t, table, k_scale=k_scale, v_scale=v_scale)

    ref = triton_call().clone()
    ref_max = float(ref.float().abs().max())
    t_tri = graph_us(triton_call)
    t_tri_e = eager_us(triton_call)
    ctas = plan_splits * nheads_k * batch
    rows.append((label, f"triton plan ({plan_splits} splits, {ctas} programs)", fmt(t_tri),
                 f"{t_tri_e:.1f}", "", "", ""))
    log(f"  {label}: triton plan {plan_splits} splits: graph {fmt(t_tri)}, eager "
        f"{t_tri_e:.1f} us (max|out| {ref_max:.1f}, fp16 ulp there {fp16_ulp(ref_max):.3g})")

    out = torch.empty_like(q)
    split_list = [plan_splits] + [s_ for s_ in sweep if s_ != plan_splits]
    for splits in split_list:
        o_part = torch.empty(batch, 1, nheads, splits, 128, dtype=torch.float32, device=device)
        l_part = torch.empty(batch, 1, nheads, splits, dtype=torch.float32, device=device)
        for vname in variants:
            opts = VARIANTS[vname]
            launch = GluonDecodeLaunch(q, k_q, v_q, k_scale, v_scale, seqlens_t, table, o_part,
                                       l_part, out, None, softmax_scale=scale,
                                       num_splits=splits, causal=True, **opts)
            launch()
            torch.cuda.synchronize()
            diff = max_err(out, ref)
            t = graph_us(launch)
            t_dec = graph_us(launch.decode)
            t_e = eager_us(launch) if splits == plan_splits else float("nan")
            ctas = splits * nheads_k * batch
            per_sm = OCCUPANCY.get(vname, {}).get("ctas_per_sm", opts.get("ctas_per_sm", 1))
            waves = ctas / (sms * per_sm) if isinstance(per_sm, int) and per_sm else float("nan")
            what = f"gluon {vname}, {splits} splits ({ctas} CTAs, {waves:.2f} waves)"
            rows.append((label, what, fmt(t), f"{t_e:.1f}", f"{t_dec:.1f}",
                         f"{t_tri / t:.2f}x", f"{diff:.1e} ({diff / fp16_ulp(ref_max):.1f} ulp)"))
            log(f"  {label}: {what}: graph {fmt(t)}, decode kernel alone {t_dec:.1f} us, eager "
                f"{t_e:.1f} us, speedup {t_tri / t:.2f}x, max |gluon - triton| {diff:.1e} = "
                f"{diff / fp16_ulp(ref_max):.1f} fp16 ulp of max|out|")
            if not diff <= REL_TOL * ref_max:
                FAILURES.append(f"{label} {what}: gluon vs triton {diff} > {REL_TOL} * {ref_max}")
            del launch
        del o_part, l_part
    del k_q, v_q, plan
    torch.cuda.empty_cache()


# Split counts beside the plan's: for GQA (8 KV heads) 33 / 66 / 99 are 1 / 2 / 3 waves of
# 264 CTAs (two an SM on 132 SMs; 2 / 4 / 6 waves of one), for MHA (12) 22 / 44 / 66; 11 and
# 49 are the 1-CTA sweep's of 2026-11-27.
BENCH_SHAPES = (
    ("GQA 32/8 64x8192", 64, 8192, 32, 8, (4,)),
    ("GQA 32/8 1x131072", 1, 131072, 32, 8, (33, 66, 99)),
    ("MHA 12/12 64x8192", 64, 8192, 12, 12, (4,)),
    ("MHA 12/12 1x131072", 1, 131072, 12, 12, (11, 22, 44, 66)),
)


def parse_shapes(text: str) -> tuple:
    """``--shapes HQ/HK:BATCHxLEN[:SPLITS/SPLITS..],..`` -> ``BENCH_SHAPES`` entries (the extra
    split counts after a second colon, "/"-separated; none: the plan's only)."""
    shapes = []
    for item in text.split(","):
        heads, shape, *extra = item.split(":")
        hq, hk = (int(x) for x in heads.split("/"))
        batch, length = (int(x) for x in shape.split("x"))
        sweep = tuple(int(x) for x in extra[0].split("/")) if extra else ()
        shapes.append((f"{hq}/{hk} {batch}x{length}", batch, length, hq, hk, sweep))
    return tuple(shapes)


def bench(variants) -> None:
    log("== (b) speed: fp8 cache (random bytes), fp16 q, page 16, random page order, causal "
        "q_len 1; CUDA-graph replay medians (do_bench_cudagraph), eager do_bench (L2 flushed) "
        f"at the plan's splits only; variants {variants}")
    rows: list = []
    for label, batch, seqlen, nh, nhk, sweep in BENCH_SHAPES:
        guarded(f"bench {label}", bench_shape, label, batch, seqlen, nh, nhk, sweep, rows,
                variants)
    if rows:
        log("")
        log("| shape | run | graph: decode + combine, K+V bandwidth (% of peak) | eager us "
            "| graph: decode kernel alone, us | vs triton (graph) | max abs gluon - triton |")
        log("|---|---|---|---|---|---|---|")
        for r in rows:
            log("| " + " | ".join(r) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--shapes", default="",
                        help="HQ/HK:BATCHxLEN[:SPLITS/..],.. instead of BENCH_SHAPES")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {list(VARIANTS)} (the timed ones)")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    if args.shapes:
        global BENCH_SHAPES
        BENCH_SHAPES = parse_shapes(args.shapes)
    start = time.time()
    try:
        import triton
        log(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"triton {triton.__version__}")
    except Exception:  # noqa: BLE001
        log(f"EXCEPTION at start:\n{traceback.format_exc()}")
        return 1
    guarded("occupancy", occupancy_check)
    if not args.skip_correctness:
        guarded("correctness", correctness)
    if not args.skip_bench:
        guarded("bench", bench, variants)
    log(f"done in {time.time() - start:.0f} s; "
        + ("all checks passed" if not FAILURES else f"FAILED: {FAILURES}"))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
