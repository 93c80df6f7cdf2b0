"""Keys with outlier channels through the library's KeyTransform and KeyOutliers (issue 26
section 2): decode output error against a float32 reference, per quantized format and key set,
for today's format, the format through ``calibrate_key_transform`` + ``paged_attention(...,
key_transform=)``, and dense-and-sparse keys (``calibrate_outlier_channels`` + ``KeyOutliers``,
``--outliers`` channels at q's precision), and each error's ratio to the same path's error on
random keys. No emulation: the caches are ``quantize_kv``'s bytes (of ``key_transform.keys(k)``
for the transform, of the keys with the outlier channels zeroed for dense-and-sparse), the newest
``--append`` tokens of every sequence zeroed and written again by ``append_paged_kv`` (with
``key_transform=`` / ``key_outliers=``), and the attention is ``kvonce.paged_attention``.

    TRITON_INTERPRET=1 PYTHONPATH=src python scripts/key_transform_accuracy.py   # CPU, < 2 min
    PYTHONPATH=src python scripts/key_transform_accuracy.py --device cuda          # bf16, larger

Key sets (scripts/quant_outliers.py's, at this script's shape; q and V N(0, 1), V quantized in
the same format, so every error includes V's; calibration: 2048 other keys of the same
distribution and positions):

- ``random``: N(0, 1).
- ``scaled``: channels 3/40/77/100 multiplied by 30/20/10/15 (scripts/quant_accuracy.py's).
- ``offset``: fixed-sign offsets of 100/40/20/10 sigma on those channels, sign per KV head.
- ``rope-1k``, ``rope-8k``: the offsets pre-RoPE on low-frequency rotary pairs, then RoPE at
  positions 0, 1, ... (0, 8, ...) for the ``--length`` keys (1024: 1k and 8k positions).

The reference is ``kvonce.reference.paged_attention_ref`` in float32 over the original keys and
values (fp16-rounded, as the cases hold them); ``plain`` is the cache in q's dtype.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Before any @triton.jit function exists (before kvonce is imported), as tests/conftest.py.
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_outliers  # noqa: E402  (make_case: the offset and RoPE key sets)

import kvonce  # noqa: E402
from kvonce.reference import paged_attention_ref  # noqa: E402

FORMATS = ("plain", "fp8_e4m3", "int8", "int4")
SCHEMES = ("today", "key_transform", "outliers")
CASES = ("random", "scaled", "offset", "rope-1k", "rope-8k")
SCALED = ((3, 30.0), (40, 20.0), (77, 10.0), (100, 15.0))  # quant_accuracy.py's outliers
PAGE = 16
SHAPES = {  # batch, length, heads, heads_k, d
    "cpu": (2, 1024, 4, 2, 128),
    "cuda": (16, 1024, 32, 8, 128),
}


def make_case(kind, seed, batch, length, heads, heads_k, d):
    """q ``[B, H, d]``, k, v ``[B, L, Hk, d]``, calibration keys ``[N, Hk, d]``, float32 holding
    fp16 values. ``random`` / ``scaled`` drawn here at any shape (quant_outliers.py takes them
    from quant_accuracy.py at its one shape), the others from quant_outliers.make_case."""
    if kind not in ("random", "scaled"):
        c = quant_outliers.make_case(kind, seed, batch, length, heads, heads_k, d)
        return c.q, c.k, c.v, c.calib
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, d, generator=g)
    k = torch.randn(batch, length, heads_k, d, generator=g)
    v = torch.randn(batch, length, heads_k, d, generator=g)
    calib = torch.randn(2 * length, heads_k, d, generator=g)
    if kind == "scaled":
        for ch, mult in SCALED:
            k[..., ch] *= mult
            calib[..., ch] *= mult
    h = lambda t: t.half().float()  # noqa: E731
    return h(q), h(k), h(v), h(calib)


def paged_cache(x, table, page=PAGE):
    """``[B, L, Hk, d]`` in sequence order -> ``[num_pages, page, Hk, d]`` at the table's pages."""
    b, length = x.shape[:2]
    out = x.new_zeros(table.numel(), page, *x.shape[2:])
    out[table.flatten().long()] = x.reshape(b * length // page, page, *x.shape[2:])
    return out


def run_case(fmt, q, k, v, seqlens, table, dtype, transform, n_append, channels=None):
    """(out, lse) of kvonce.paged_attention over a cache of ``fmt`` holding k (through
    ``transform`` when given; with ``channels``, dense-and-sparse: those channels per KV head in
    a side cache) and v."""
    batch, length = k.shape[:2]
    keys = k if transform is None else transform.keys(k)
    k_cache, v_cache = paged_cache(keys, table), paged_cache(v, table)
    outliers = None
    if channels is not None:
        outliers = kvonce.new_key_outliers(channels, k_cache.shape[0], PAGE)
        k_cache, sparse = outliers.split(k_cache)
        outliers.values.copy_(sparse)
    if fmt == "plain":
        k_cache, v_cache, ks, vs = k_cache.to(dtype), v_cache.to(dtype), None, None
    else:
        k_cache, ks = kvonce.quantize_kv(k_cache, fmt)
        v_cache, vs = kvonce.quantize_kv(v_cache, fmt)
    kv_format = "int4" if fmt == "int4" else None
    # The newest n_append tokens of each sequence: zeroed, then written by the append path.
    start = length - n_append
    pos = torch.arange(start, length, device=k.device)
    pages, slots = table[:, pos // PAGE].long(), pos % PAGE
    k_cache.view(torch.uint8)[pages, slots] = 0
    v_cache.view(torch.uint8)[pages, slots] = 0
    if outliers is not None:
        outliers.values[pages, slots] = 0
    new_k, new_v = k[:, start:], v[:, start:]
    if fmt == "plain":
        new_k, new_v = new_k.to(dtype), new_v.to(dtype)
    kvonce.append_paged_kv(new_k.contiguous(), new_v.contiguous(), k_cache, v_cache,
                           torch.full_like(seqlens, start), table, k_scale=ks, v_scale=vs,
                           kv_format=kv_format, key_transform=transform, key_outliers=outliers)
    out, lse = kvonce.paged_attention(q[:, None].to(dtype), k_cache, v_cache, seqlens, table,
                                      return_lse=True, k_scale=ks, v_scale=vs,
                                      kv_format=kv_format, key_transform=transform,
                                      key_outliers=outliers)
    return out[:, 0].float(), lse[:, :, 0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    choices=("cpu", "cuda"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--alpha", type=float, default=0.75, help="calibrate_key_transform's alpha")
    ap.add_argument("--outliers", type=int, default=8,
                    help="dense-and-sparse: channels per KV head kept at q's precision")
    ap.add_argument("--append", type=int, default=16,
                    help="newest tokens per sequence written by append_paged_kv")
    ap.add_argument("--shape", help="batch,length,heads,heads_k,d (default per device: "
                    + "; ".join(f"{k} {','.join(map(str, v))}" for k, v in SHAPES.items()) + ")")
    args = ap.parse_args(argv)
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--device cpu needs TRITON_INTERPRET=1 (set it before the run)")
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float16  # interpreter: no bf16 dot
    shape = (tuple(int(x) for x in args.shape.split(",")) if args.shape
             else SHAPES[dev.type])
    batch, length, heads, heads_k, d = shape
    if length % PAGE or not 0 < args.append <= length:
        ap.error(f"length must be a multiple of {PAGE} and 0 < --append <= length")
    cases, formats = args.cases.split(","), args.formats.split(",")
    t0 = time.time()
    g = torch.Generator().manual_seed(args.seed)
    table = torch.randperm(batch * length // PAGE, generator=g).reshape(batch, -1)
    table = table.to(torch.int32).to(dev)
    seqlens = torch.full((batch,), length, dtype=torch.int32, device=dev)
    errs = {}
    for kind in cases:
        q, k, v, calib = (t.to(dev) for t in make_case(kind, args.seed, *shape))
        ref, ref_lse = paged_attention_ref(q[:, None], paged_cache(k, table),
                                           paged_cache(v, table), seqlens, table)
        ref, ref_lse = ref[:, 0], ref_lse[:, :, 0]
        kt = kvonce.calibrate_key_transform(calib, alpha=args.alpha)
        channels = kvonce.calibrate_outlier_channels(calib, n=args.outliers)
        for fmt in formats:
            for name in SCHEMES:
                if name == "outliers" and fmt == "plain":
                    errs[fmt, kind, name] = None, None
                    continue
                out, lse = run_case(fmt, q, k, v, seqlens, table, dtype,
                                    kt if name == "key_transform" else None, args.append,
                                    channels if name == "outliers" else None)
                err = ((out - ref).norm() / ref.norm()).item()
                errs[fmt, kind, name] = err, (lse - ref_lse).abs().max().item()
    print(f"Decode output relative error vs float32 attention over the original keys "
          f"({args.device}, q {str(dtype).removeprefix('torch.')}, batch {batch} x {length} keys, "
          f"{heads}/{heads_k} heads, d {d}, page {PAGE}, alpha {args.alpha}, outlier channels "
          f"{args.outliers}, seed {args.seed}, newest {args.append} tokens appended). x random: "
          f"the same path's error on random keys. lse: max |lse error|.\n")
    print("| format | key set | " + " | ".join(f"{n} | x random | lse" for n in SCHEMES) + " |")
    print("|---|---|" + "---|---|---|" * len(SCHEMES))
    for fmt in formats:
        for kind in cases:
            cells = []
            for name in SCHEMES:
                err, lse_err = errs[fmt, kind, name]
                if err is None:
                    cells += ["-", "-", "-"]
                    continue
                base = errs.get((fmt, "random", name), (None,))[0]
                ratio = f"{err / base:.2f}x" if base else "-"
                cells += [f"{err:.2e}", ratio, f"{lse_err:.1e}"]
            print(f"| {fmt} | {kind} | " + " | ".join(cells) + " |")
    if "random" in cases and len(cases) > 1:
        print("\n| format | worst x random: " + " | ".join(SCHEMES) + " |")
        print("|---|" + "---|" * len(SCHEMES))
        for fmt in formats:
            worst = ["-" if errs[fmt, "random", n][0] is None else
                     f"{max(errs[fmt, c, n][0] for c in cases if c != 'random') / errs[fmt, 'random', n][0]:.2f}x"
                     for n in SCHEMES]
            print(f"| {fmt} | " + " | ".join(worst) + " |")
    print(f"\n({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
