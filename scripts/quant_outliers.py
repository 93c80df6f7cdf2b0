"""Keys with outlier channels (issue 26 section 2): output error of candidate K quantization
schemes for fp8 / int8 / int4, against the fp16 cache, on random keys and on keys with outlier
channels. Pure PyTorch emulation on the CPU (the kernels are not touched): today's formats through
``kvonce.quantize_kv`` / ``dequantize_kv``, the candidates as float32 arithmetic around them.

    PYTHONPATH=src python scripts/quant_outliers.py [--k-only] [--seed N] [--cases a,b,...]

Key sets (batch 4 x 1024 keys, 8/2 heads, d128, page 16; q and V N(0, 1); V always in the
format's own scheme, so every error includes V's):

- ``random``: N(0, 1) (scripts/quant_accuracy.py's data, gathered to sequence order).
- ``scaled``: quant_accuracy.py's outliers: channels 3/40/77/100 multiplied by 30/20/10/15. Zero
  mean: the outlier channels carry 13x the logit variance of the rest, real signal.
- ``offset``: a fixed-sign offset of 100/40/20/10 (x the other channels' std) on channels
  3/40/77/100, sign per KV head; std 1 everywhere. The offset adds q.mu, the same to every key a
  query sees, so it changes nothing in the softmax: it only costs range.
- ``offset+spread``: the same offsets, and std 3 on those channels.
- ``rope-1k``: the offsets placed pre-RoPE on low-frequency rotary pairs (rotate_half layout,
  pairs 63/60/54/48, base 10000), then RoPE at positions 0..1023 (q at 1024): the cache holds
  post-RoPE keys, whose offsets turn slowly with position (1.0 rad for pair 48 over 1k tokens).
- ``rope-8k``: as rope-1k with the 1024 keys at positions 0, 8, ..., 8184 (q at 8192): the offset
  of pair 48 turns 8 rad, pair 63 0.9 rad.

Calibration data (for every fixed per-(layer, KV head) vector or channel set): 2048 other keys
of the same distribution and positions. ``first page`` estimates use sequence 0's first 16 keys.

The schemes (``SCHEMES``; ``LEGEND`` gives bytes, decode-kernel and append cost, and whether a
shared-prefix page can be quantized once for every sequence).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_accuracy  # noqa: E402  (its case() is the random / scaled data)

from kvonce.paged.quant import dequantize_kv, quantize_kv  # noqa: E402

PAGE = 16
TINY = 2.0 ** -24
FP8_MAX = 448.0
FORMATS = ("fp8_e4m3", "int8", "int4")
OUTLIER_CH = (3, 40, 77, 100)
OFFSETS = (100.0, 40.0, 20.0, 10.0)
ROPE_PAIRS = (63, 60, 54, 48)
ROPE_BASE = 10000.0
CASES = ("random", "scaled", "offset", "offset+spread", "rope-1k", "rope-8k")
# K bytes per (token, KV head) at d=128 of today's formats (data + per-token scales); V the same.
BASE_BYTES = {"fp8_e4m3": 128, "int8": 132, "int4": 72}
FP16_BYTES = 2 * 256


# ----------------------------------------------------------------------------------------------
# Data

class Case:
    """q ``[B, H, d]``, k and v ``[B, L, Hk, d]`` (float32 holding fp16 values), calibration keys
    ``calib [N, Hk, d]``, ``rope`` (pairs tied for channel statistics)."""

    def __init__(self, name, q, k, v, calib, rope):
        self.name, self.q, self.k, self.v, self.calib, self.rope = name, q, k, v, calib, rope


def _gathered(outliers: bool, seed: int):
    q, k, v, seqlens, table = quant_accuracy.case(outliers, seed)
    batch = q.shape[0]
    k = k[table.long()].reshape(batch, -1, *k.shape[2:])
    v = v[table.long()].reshape(batch, -1, *v.shape[2:])
    return q[:, 0].float(), k.float(), v.float()


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """rotate_half RoPE (HF Llama) of ``x [..., L, H, d]`` at positions ``pos [L]``."""
    d = x.shape[-1]
    theta = ROPE_BASE ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
    ang = pos.double()[:, None] * theta[None, :]  # [L, d/2]
    cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _synth_keys(kind, g, signs, nseq, length, heads_k, d, stride):
    x = torch.randn(nseq, length, heads_k, d, generator=g)
    chans = ROPE_PAIRS if kind.startswith("rope") else OUTLIER_CH
    for i, (ch, off) in enumerate(zip(chans, OFFSETS)):
        if kind == "offset+spread":
            x[..., ch] *= 3.0
        x[..., ch] += signs[:, i] * off
    if kind.startswith("rope"):
        x = rope(x, torch.arange(length) * stride)
    return x


def make_case(kind: str, seed: int = 0, batch=4, length=1024, heads=8, heads_k=2, d=128) -> Case:
    if kind in ("random", "scaled"):
        if (batch, length, heads, heads_k, d) != (4, 1024, 8, 2, 128):
            raise ValueError("random/scaled are quant_accuracy.py's fixed shape")
        q, k, v = _gathered(kind == "scaled", seed)
        _, kc, _ = _gathered(kind == "scaled", seed + 1000)
        return Case(kind, q, k, v, kc[:2].reshape(-1, heads_k, d), rope=False)
    g = torch.Generator().manual_seed(seed)
    signs = torch.where(torch.rand(heads_k, len(OFFSETS), generator=torch.Generator()
                                   .manual_seed(1234)) < 0.5, -1.0, 1.0)
    stride = 8 if kind == "rope-8k" else 1
    q = torch.randn(batch, 1, heads, d, generator=g)
    k = _synth_keys(kind, g, signs, batch, length, heads_k, d, stride)
    v = torch.randn(batch, length, heads_k, d, generator=g)
    calib = _synth_keys(kind, g, signs, 2, length, heads_k, d, stride).reshape(-1, heads_k, d)
    if kind.startswith("rope"):
        q = rope(q, torch.tensor([length * stride]))
    h = lambda t: t.half().float()  # noqa: E731
    return Case(kind, h(q[:, 0]), h(k), h(v), h(calib), rope=kind.startswith("rope"))


# ----------------------------------------------------------------------------------------------
# Attention and quantizers (float32 in, dequantized float32 out)

def attend(q, k, v):
    """Decode attention, q ``[B, H, d]`` over k, v ``[B, L, Hk, d]`` (q head h -> KV head
    h // (H / Hk)); returns out ``[B, H, d]``, lse ``[B, H]``."""
    b, h, d = q.shape
    hk = k.shape[2]
    s = torch.einsum("bhgd,blhd->bhgl", q.reshape(b, hk, h // hk, d), k) / math.sqrt(d)
    o = torch.einsum("bhgl,blhd->bhgd", torch.softmax(s, dim=-1), v)
    return o.reshape(b, h, d), torch.logsumexp(s, dim=-1).reshape(b, h)


def std_format(x, fmt):
    """Today's format (kvonce.quantize_kv): fp8 per-KV-head scale over the whole cache, int8 per
    (token, head), int4 per 32 channels per token."""
    xq, s = quantize_kv(x.contiguous(), fmt)
    return dequantize_kv(xq, s, fmt, torch.float32)


def sym(x, bits, dims):
    qmax = 2 ** (bits - 1) - 1
    s = (x.abs().amax(dims, keepdim=True) / qmax).clamp(min=TINY).half().float()
    return torch.clamp(torch.round(x / s), -qmax, qmax) * s


def asym(x, bits, dims):
    lo = x.amin(dims, keepdim=True).half().float()
    s = ((x.amax(dims, keepdim=True) - lo) / (2 ** bits - 1)).clamp(min=TINY).half().float()
    return torch.clamp(torch.round((x - lo) / s), 0, 2 ** bits - 1) * s + lo


def fp8(x, s):
    return torch.clamp(x / s, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s


def paged(x):
    """``[B, L, Hk, d]`` -> ``[B, L / PAGE, PAGE, Hk, d]`` (reduce over dim 2: per page)."""
    return x.reshape(x.shape[0], -1, PAGE, *x.shape[2:])


def per_channel_page(x, fmt, asymmetric):
    """KIVI: one scale (and zero point) per (page, KV head, channel), fp16."""
    xp = paged(x)
    if fmt == "fp8_e4m3":
        y = fp8(xp, (xp.abs().amax(2, keepdim=True) / FP8_MAX).clamp(min=TINY).half().float())
    else:
        bits = 8 if fmt == "int8" else 4
        y = (asym if asymmetric else sym)(xp, bits, 2)
    return y.reshape(x.shape)


def per_token(x, bits, asymmetric):
    """One fp16 scale (and zero point) per (token, KV head) over all d channels."""
    return (asym if asymmetric else sym)(x, bits, -1)


def hadamard(d):
    return quant_accuracy.hadamard(d)


def tie_pairs(stat, rope_tied):
    """Per-channel statistic ``[Hk, d]``; with RoPE, channels i and i + d/2 share the max (a
    per-channel factor must commute with the rotation of each pair)."""
    if not rope_tied:
        return stat
    d = stat.shape[-1]
    m = torch.maximum(stat[..., : d // 2], stat[..., d // 2:])
    return torch.cat([m, m], dim=-1)


# ----------------------------------------------------------------------------------------------
# Schemes: f(fmt, case) -> (q_eff [B, H, d], k_hat [B, L, Hk, d], K bytes per token per head)
# or None where the scheme does not apply to the format. k_hat is what the softmax sees, up to a
# shift that is the same for every key of a query (centring adds c back: softmax-identical to
# the kernel working on deq(k - c) with q unchanged).

def _q_times(case, s):  # q heads of KV head j scaled by s[j]
    b, h, d = case.q.shape
    hk = s.shape[0]
    return (case.q.reshape(b, hk, h // hk, d) * s[None, :, None, :]).reshape(b, h, d)


def centre_of(case, how):
    if how == "calib":
        return case.calib.mean(0)
    if how == "first page":
        return case.k[0, :PAGE].mean(0)
    if how == "0.5x calib":
        return 0.5 * case.calib.mean(0)
    if how == "1.5x calib":
        return 1.5 * case.calib.mean(0)
    raise ValueError(how)


def centre_vec(case, how="calib"):
    """The per-(layer, KV head) vector, rounded to fp16 (as it would be stored)."""
    return centre_of(case, how).half().float()


def s_today(fmt, case):
    return case.q, std_format(case.k, fmt), BASE_BYTES[fmt]


def s_pc_page(asymmetric):
    def f(fmt, case):
        if fmt == "fp8_e4m3" and asymmetric:
            return None
        data = {"fp8_e4m3": 128, "int8": 128, "int4": 64}[fmt]
        extra = (4 if asymmetric else 2) * case.k.shape[-1] // PAGE
        return case.q, per_channel_page(case.k, fmt, asymmetric), data + extra
    return f


def s_centre(how):
    def f(fmt, case):
        c = centre_vec(case, how)
        return case.q, std_format(case.k - c, fmt) + c, BASE_BYTES[fmt]
    return f


def s_centre_page(fmt, case):
    """Centred by each page's own mean (stored per page: the kernel adds q.c_p per page)."""
    kp = paged(case.k)
    c = kp.mean(2, keepdim=True).half().float()
    y = std_format((kp - c).reshape(case.k.shape), fmt)
    extra = 2 * case.k.shape[-1] // PAGE
    return case.q, (paged(y) + c).reshape(case.k.shape), BASE_BYTES[fmt] + extra


def s_smooth(alpha, centre, rotate=False, how="calib", int4_token=False):
    """QServe SmoothAttention: K / s, q * s per channel, s = (calibration max |K_c - c_c|)^alpha
    tied across RoPE pairs; optionally after centring (c estimated ``how``) and before a
    Hadamard; ``int4_token``: int4 with one asymmetric scale per token instead of the format."""
    def f(fmt, case):
        if int4_token and fmt != "int4":
            return None
        c = centre_vec(case, how) if centre else torch.zeros_like(case.calib[0])
        amax = (case.calib - c).abs().amax(0)
        s = tie_pairs(amax, case.rope).clamp(min=1e-3) ** alpha
        s = (s / s.log().mean(-1, keepdim=True).exp()).half().float()
        h = hadamard(case.k.shape[-1]) if rotate else torch.eye(case.k.shape[-1])
        x = ((case.k - c) / s) @ h
        if int4_token:
            k_hat, nbytes = _int4_tok_asym(x), 68
        else:
            k_hat, nbytes = std_format(x, fmt), BASE_BYTES[fmt]
        return _q_times(case, s) @ h, k_hat + (c / s) @ h, nbytes
    return f


def s_rotate(centre, quant=None):
    """Fixed Hadamard on K and q (after centring K if ``centre``); ``quant`` replaces the format
    (int4 per-token variants)."""
    def f(fmt, case):
        if quant is not None and fmt != "int4":
            return None
        h = hadamard(case.k.shape[-1])
        c = centre_vec(case) if centre else torch.zeros_like(case.calib[0])
        kr = (case.k - c) @ h
        if quant is None:
            k_hat, nbytes = std_format(kr, fmt), BASE_BYTES[fmt]
        else:
            k_hat, nbytes = quant(kr), (68 if quant is _int4_tok_asym else 66)
        return case.q @ h, k_hat + c @ h, nbytes
    return f


def _int4_tok_sym(x):
    return per_token(x, 4, False)


def _int4_tok_asym(x):
    return per_token(x, 4, True)


def s_int4_token(asymmetric):
    def f(fmt, case):
        if fmt != "int4":
            return None
        return case.q, per_token(case.k, 4, asymmetric), 68 if asymmetric else 66
    return f


def s_dense_sparse(n, centre, int4_token_rotated=False, sparse_int8=False):
    """KVQuant dense-and-sparse with a fixed channel set: the n channels of largest calibration
    |k| (after centring) per KV head kept in fp16, the rest quantized (those channels zeroed).
    ``int4_token_rotated``: the dense part Hadamard-rotated and int4 with one asymmetric scale per
    token (issue 26 section 1 item 3's int4 format); the sparse dot uses q unrotated.
    ``sparse_int8``: the n kept channels in int8 with one fp16 scale per token over them (n + 2
    bytes instead of 2n)."""
    def f(fmt, case):
        if int4_token_rotated and fmt != "int4":
            return None
        c = centre_vec(case) if centre else torch.zeros_like(case.calib[0])
        amax = (case.calib - c).abs().amax(0)  # [Hk, d]
        idx = amax.topk(n, dim=-1).indices
        keep = torch.zeros_like(amax, dtype=torch.bool).scatter_(-1, idx, True)
        x = case.k - c
        dense = torch.where(keep, 0.0, x)
        if int4_token_rotated:
            h = hadamard(x.shape[-1])
            dense_hat, nbytes = _int4_tok_asym(dense @ h) @ h.T, 68
        else:
            dense_hat, nbytes = std_format(dense, fmt), BASE_BYTES[fmt]
        if sparse_int8:   # the kept channels gathered, int8 with a per-token scale, scattered back
            gather = idx.expand(*x.shape[:-1], n)
            sparse = x.gather(-1, gather)
            x = x.scatter(-1, gather, sym(sparse, 8, -1))
        k_hat = torch.where(keep, x, dense_hat)
        return case.q, k_hat + c, nbytes + (n + 2 if sparse_int8 else 2 * n)
    return f


def s_static_channel(fmt, case):
    """Centred keys with a static per-(layer, KV head, channel) scale from calibration (no
    per-token scale; values beyond the calibrated range clip)."""
    if fmt == "fp8_e4m3":
        return None
    bits = 8 if fmt == "int8" else 4
    qmax = 2 ** (bits - 1) - 1
    c = centre_vec(case)
    s = ((case.calib - c).abs().amax(0) / qmax).clamp(min=TINY).half().float()
    x = case.k - c
    return case.q, torch.clamp(torch.round(x / s), -qmax, qmax) * s + c, bits * 16


# (name, family, function)
SCHEMES = [
    ("as today", "today", s_today),
    ("per-channel/page sym", "pc-page", s_pc_page(False)),
    ("per-channel/page asym (KIVI)", "pc-page", s_pc_page(True)),
    ("centre c=calib", "centre", s_centre("calib")),
    ("centre c=first page", "centre", s_centre("first page")),
    ("centre c=0.5x calib (off)", "centre", s_centre("0.5x calib")),
    ("centre c=1.5x calib (off)", "centre", s_centre("1.5x calib")),
    ("centre c=page mean", "centre-page", s_centre_page),
    ("smooth a=0.5 into q", "smooth", s_smooth(0.5, False)),
    ("centre + smooth a=0.5", "smooth", s_smooth(0.5, True)),
    ("centre + smooth a=1", "smooth", s_smooth(1.0, True)),
    ("centre + smooth a=0.5 + Hadamard", "smooth", s_smooth(0.5, True, rotate=True)),
    ("centre + smooth a=0.75 + Hadamard", "smooth", s_smooth(0.75, True, rotate=True)),
    ("centre + smooth a=1 + Hadamard", "smooth", s_smooth(1.0, True, rotate=True)),
    ("smooth a=0.75 + Hadamard (no centre)", "smooth", s_smooth(0.75, False, rotate=True)),
    ("c=first page + smooth a=0.75 + Hadamard", "smooth",
     s_smooth(0.75, True, rotate=True, how="first page")),
    ("c=0.5x calib (off) + smooth a=0.75 + Hadamard", "smooth",
     s_smooth(0.75, True, rotate=True, how="0.5x calib")),
    ("Hadamard", "rotate", s_rotate(False)),
    ("centre + Hadamard", "rotate", s_rotate(True)),
    ("dense&sparse n=4", "d&s", s_dense_sparse(4, False)),
    ("dense&sparse n=8", "d&s", s_dense_sparse(8, False)),
    ("centre + d&s n=4", "d&s", s_dense_sparse(4, True)),
    ("centre + d&s n=8", "d&s", s_dense_sparse(8, True)),
    ("d&s n=8, sparse int8/token", "d&s-int8", s_dense_sparse(8, False, sparse_int8=True)),
    ("centre + d&s n=8, sparse int8/token", "d&s-int8", s_dense_sparse(8, True, sparse_int8=True)),
    ("d&s n=4, sparse int8/token", "d&s-int8", s_dense_sparse(4, False, sparse_int8=True)),
    ("centre + static per-channel scale", "static-ch", s_static_channel),
    ("int4/token sym", "int4-token", s_int4_token(False)),
    ("int4/token asym", "int4-token", s_int4_token(True)),
    ("int4/token sym + Hadamard", "int4-token", s_rotate(False, _int4_tok_sym)),
    ("int4/token sym + centre + Hadamard", "int4-token", s_rotate(True, _int4_tok_sym)),
    ("int4/token asym + centre + Hadamard", "int4-token", s_rotate(True, _int4_tok_asym)),
    ("int4/token asym + Hadamard + d&s n=8", "int4-token", s_dense_sparse(8, False, True)),
    ("int4/token asym + centre + smooth a=0.75 + Hadamard", "int4-token",
     s_smooth(0.75, True, rotate=True, int4_token=True)),
]

LEGEND = {
    "today": ("-", "as today", "as today", "yes (fp8: per-head scale fixed at cache creation)"),
    "pc-page": ("+16 B sym / +32 B asym (fp16 per channel per 16-token page)",
                "scale on the contraction dim: per-page sub-dots (q*s_p).K_p, BLOCK_N/16 of them "
                "per tile, or N x d multiplies on the K tile; asym also S -= q.(s*z)_p per page",
                "needs the whole page: an fp16 open page (KIVI's residual) or requantize the page "
                "each step", "yes (per page)"),
    "centre": ("+0 (d fp16 per layer and KV head)",
               "nothing per key (q.c is the same for every key of a query); LSE += scale*q.c "
               "once per query row where the LSE leaves the kernel to meet un-centred parts",
               "one vector subtract per token", "yes (per layer, KV head)"),
    "centre-page": ("+16 B (fp16 d-vector per page)",
                    "S += q.c_p: a [M, d] x [d, BLOCK_N/16] dot and a broadcast per tile",
                    "needs the whole page (as pc-page)", "yes (per page)"),
    "smooth": ("+0", "q * s once per query row (or folded into W_q, W_k: s tied across RoPE "
                     "pairs); nothing per key", "one vector divide per token",
               "yes (per layer, KV head)"),
    "rotate": ("+0", "q @ H once per query row (FWHT, d log d); nothing per key",
               "K @ H per token (FWHT)", "yes (fixed matrix)"),
    "d&s": ("+2n B (fp16 values of n fixed channels)",
            "a second dot per tile q[:, idx] (M x n, n padded to 16) . K_sparse (n x N), fp16; "
            "+2n B loaded per key", "gather n channels, zero them in the quantized part",
            "yes (channel set per layer, KV head)"),
    "d&s-int8": ("+n + 2 B (int8 values of n fixed channels, one fp16 scale per token)",
                 "as d&s, the sparse dot's n-column operand converted from int8 and its scores "
                 "scaled per key", "as d&s, plus one amax over n per token",
                 "yes (channel set per layer, KV head)"),
    "static-ch": ("-4 B int8 (no per-token scale), int4 -8 B",
                  "q * s once per query row; no per-key scale at all",
                  "one vector subtract and divide per token",
                  "yes (per layer, KV head); clips beyond the calibrated range"),
    "int4-token": ("66 B sym / 68 B asym (fp16 scale (+ zero) per token, no group scales)",
                   "S_j = s_j (q.k_int_j) (+ z_j sum(q), asym): one scale (and one fma) per score",
                   "one amax (min/max) over d per token", "yes"),
}


# ----------------------------------------------------------------------------------------------

def evaluate(case: Case, fmt: str, fn, k_only: bool = False):
    """Output relative error against the fp16 cache (or None), and K bytes per token per head."""
    if not hasattr(case, "ref"):
        case.ref = attend(case.q, case.k, case.v)[0]
    ref = case.ref
    res = fn(fmt, case)
    if res is None:
        return None, None
    q_eff, k_hat, kbytes = res
    v_hat = case.v if k_only else std_format(case.v, fmt)
    out, _ = attend(q_eff, k_hat, v_hat)
    return ((out - ref).norm() / ref.norm()).item(), kbytes


def run_table(cases, schemes=SCHEMES, formats=FORMATS, k_only=False, out=print):
    errs = {}
    for case in cases:
        for fmt in formats:
            for name, _, fn in schemes:
                errs[case.name, fmt, name] = evaluate(case, fmt, fn, k_only)
    names = [c.name for c in cases]
    out(f"| format | scheme | K+V B/token/head (ratio to fp16) | "
        + " | ".join(names) + " | worst outlier case / own random |")
    out("|---|---|---|" + "---|" * len(names) + "---|")
    for fmt in formats:
        base = errs.get((names[0], fmt, "as today"), (None,))[0] if "random" == names[0] else None
        for name, _, _ in schemes:
            row = [errs[c, fmt, name] for c in names]
            if row[0][0] is None:
                continue
            kb = row[0][1]
            total = kb + BASE_BYTES[fmt]
            cells = []
            for e, _ in row:
                cells.append(f"{e:.2e}" + (f" ({e / base:.1f}x)" if base else ""))
            worst = ""
            if names[0] == "random" and len(names) > 1:
                worst = f"{max(e for e, _ in row[1:]) / row[0][0]:.1f}x"
            out(f"| {fmt} | {name} | {total} ({FP16_BYTES / total:.2f}x) | "
                + " | ".join(cells) + f" | {worst} |")
    return errs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--k-only", action="store_true", help="also the table with V kept in fp16")
    ap.add_argument("--no-legend", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    torch.manual_seed(args.seed)
    cases = [make_case(name, args.seed) for name in args.cases.split(",")]
    print("Output relative error vs the fp16 cache (K and V quantized; in brackets: x today's "
          "format on random keys):\n")
    run_table(cases)
    if args.k_only:
        print("\nK quantized only (V fp16):\n")
        run_table(cases, k_only=True)
    if not args.no_legend:
        print("\n| scheme family | extra K bytes per token per KV head | decode kernel extra | "
              "append extra | shared-prefix pages quantized once |")
        print("|---|---|---|---|---|")
        for fam, (b, kern, app, pre) in LEGEND.items():
            print(f"| {fam} | {b} | {kern} | {app} | {pre} |")
    print(f"\n({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
