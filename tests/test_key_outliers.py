"""Dense-and-sparse keys (kvonce.paged.outliers): a quantized cache whose keys keep a few outlier
channels per KV head at q's precision in a side cache. The kernels add ``q[channels] . values``
to every score; the output is attention over ``merge(dequantize(stored), values)``, and keys
with outlier channels quantize about as well as keys without.

CPU (interpreter): small sizes, fp16/fp32 queries. CUDA: bf16 and fp16, head dim 128.
"""
import math

import pytest
import torch
from conftest import DEVICE, DTYPES, HAS_CUDA, poison_empty

import kvonce
from kvonce.paged import KeyOutliers, calibrate_outlier_channels, new_key_outliers
from kvonce.reference import paged_attention_ref, paged_prefill_ref

FORMATS = ("fp8_e4m3", "int8", "int4")
SHAPE = (3, 2, 8, 2, 64, 16) if not HAS_CUDA else (8, 1, 32, 8, 128, 16)  # b, q_len, h, hk, d, page
LENS = [70, 0, 33] if not HAS_CUDA else [1000] * 6 + [0, 17]


def _keys(n, heads_k, d, kind, gen, positions=None):
    """``[n, heads_k, d]`` keys: N(0, 1) (``random``); four channels with fixed-sign offsets of
    100/40/20/10 sigma (``offset``); four zero-mean channels 30/20/10/15 times wider
    (``scaled``); or the offsets on four rotary pairs before a NeoX RoPE (base 10000) at
    ``positions`` (``rope``: they turn with position, as real keys' do)."""
    k = torch.randn(n, heads_k, d, generator=gen)
    chans = (3, d // 4 + 1, d // 2 + 8, d - 7)
    if kind == "offset":
        for ch, size in zip(chans, (100.0, 40.0, 20.0, 10.0)):
            k[:, :, ch] += size * (torch.randint(0, 2, (heads_k,), generator=gen) * 2 - 1)
    elif kind == "scaled":
        for ch, size in zip(chans, (30.0, 20.0, 10.0, 15.0)):
            k[:, :, ch] *= size
    elif kind == "rope":
        half = d // 2
        pairs = (half - 1, half - 4, half - 10, half - 16)
        for i, size in zip(pairs, (100.0, 40.0, 20.0, 10.0)):
            k[:, :, i] += size
            k[:, :, i + half] += 0.5 * size
        freq = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
        angle = positions.double()[:, None] * freq[None, :]           # [n, half]
        cos, sin = angle.cos().float()[:, None, :], angle.sin().float()[:, None, :]
        x, y = k[..., :half].clone(), k[..., half:].clone()
        k[..., :half], k[..., half:] = x * cos - y * sin, x * sin + y * cos
    return k


def _case(kind, dtype, seed=0, shape=SHAPE, lens=LENS):
    """A paged decode batch over keys of ``kind``: q, K/V caches (pages in random order, the
    cache's position p of page slot s at 8 * (page * i + s) for rope), seqlens, block table,
    and calibration keys drawn like the cache's."""
    gen = torch.Generator().manual_seed(seed)
    batch, q_len, heads, heads_k, d, page = shape
    pages_per_seq = -(-max(lens) // page)
    num_pages = batch * pages_per_seq + 2
    positions = torch.arange(num_pages * page) * 8 % 8192
    k = _keys(num_pages * page, heads_k, d, kind, gen, positions)
    k = k.reshape(num_pages, page, heads_k, d)
    v = torch.randn(num_pages, page, heads_k, d, generator=gen)
    q = torch.randn(batch, q_len, heads, d, generator=gen)
    table = torch.randperm(num_pages, generator=gen)[:batch * pages_per_seq]
    calib_gen = torch.Generator().manual_seed(seed + 100)
    calib = _keys(2048, heads_k, d, kind, calib_gen, torch.arange(2048) * 4 % 8192)
    if kind == "offset":  # the cache's signs (another draw gave other ones)
        calib = calib - calib.mean(0) + k.reshape(-1, heads_k, d).mean(0)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return (to(q).to(dtype), to(k).to(dtype), to(v).to(dtype),
            torch.tensor(lens, dtype=torch.int32, device=DEVICE),
            to(table.reshape(batch, pages_per_seq).to(torch.int32)), to(calib))


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _store(k, v, fmt, channels, values_dtype=torch.float16):
    """A whole cache stored dense-and-sparse as the format defines it: the side cache (fp16 by
    default) from ``KeyOutliers.split``, the dense keys and V through ``quantize_kv``."""
    ko = new_key_outliers(channels, k.shape[0], k.shape[1], values_dtype)
    dense, sparse = ko.split(k)
    ko.values.copy_(sparse)
    kq, ks = kvonce.quantize_kv(dense, fmt)
    vq, vs = kvonce.quantize_kv(v, fmt)
    return ko, kq, ks, vq, vs


def _poison_unused(ko, seqlens, table):
    """Side-cache slots no sequence uses are NaN: they must never be read."""
    used = torch.zeros(ko.values.shape[:2], dtype=torch.bool, device=ko.values.device)
    page = ko.values.shape[1]
    for b, n in enumerate(seqlens.tolist()):
        for p in range(n):
            used[table[b, p // page], p % page] = True
    ko.values[~used] = float("nan")


def _fmt_kw(fmt):
    return dict(kv_format="int4" if fmt == "int4" else None)


# (q dtype, values dtype): fp16 values under every q, and values in q's own dtype where it differs.
VALUE_CASES = [(dt, "fp16") for dt in DTYPES] + [(dt, "q") for dt in DTYPES
                                                   if dt != torch.float16]


@pytest.mark.parametrize("dtype,values", VALUE_CASES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_is_attention_over_the_merged_keys(fmt, dtype, values, num_splits):
    """Output and LSE against the float32 attention of ``merge(dequantize_kv(stored), values)``
    (the keys the format defines), GQA, q_len > 1 causal on CPU, an empty sequence (out 0, lse
    -inf), unused side-cache slots NaN; fp16 values under any q (bf16 q: through fp16 rows) and
    values in q's dtype; dropping the side cache gives another answer."""
    q, k, v, seqlens, table, calib = _case("offset", dtype)
    ko, kq, ks, vq, vs = _store(k, v, fmt, calibrate_outlier_channels(calib),
                                torch.float16 if values == "fp16" else dtype)
    _poison_unused(ko, seqlens, table)
    k_seen = ko.merge(kvonce.dequantize_kv(kq, ks, fmt, torch.float32), ko.values.float())
    v_seen = kvonce.dequantize_kv(vq, vs, fmt, torch.float32)
    ref, ref_lse = paged_attention_ref(q.float(), torch.nan_to_num(k_seen), v_seen, seqlens,
                                       table)
    with poison_empty:
        out, lse = kvonce.paged_attention(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                          return_lse=True, num_splits=num_splits,
                                          key_outliers=ko, **_fmt_kw(fmt))
    assert out.dtype == dtype and not out.isnan().any() and not lse.isnan().any()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    assert _rel(out, ref) < tol, _rel(out, ref)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin) and not fin.all()
    assert (lse[fin] - ref_lse[fin]).abs().max() < (1e-3 if dtype == torch.float32 else 5e-2)
    empty = seqlens == 0
    assert (out[empty] == 0).all()
    without = kvonce.paged_attention(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                     num_splits=num_splits, **_fmt_kw(fmt))
    assert _rel(without, ref) > 10 * max(_rel(out, ref), 1e-3)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_int4_v_units_with_outlier_keys(num_splits):
    """int4 with V read as 16-bit units (``v_pairs``, fp16 q; the GPU row's form, which the
    interpreter's config leaves off) and dense-and-sparse keys: the outlier scores join the
    nibble planes' and the output equals the float32 attention of the keys the format defines."""
    import dataclasses

    from kvonce.kernels.configs import get_paged_decode_config
    q, k, v, seqlens, table, calib = _case("offset", torch.float16,
                                           shape=SHAPE[:4] + (128,) + SHAPE[5:])  # d = 128
    ko, kq, ks, vq, vs = _store(k, v, "int4", calibrate_outlier_channels(calib))
    _poison_unused(ko, seqlens, table)
    k_seen = ko.merge(kvonce.dequantize_kv(kq, ks, "int4", torch.float32), ko.values.float())
    v_seen = kvonce.dequantize_kv(vq, vs, "int4", torch.float32)
    ref, _ = paged_attention_ref(q.float(), torch.nan_to_num(k_seen), v_seen, seqlens, table)
    cap = torch.cuda.get_device_capability() if HAS_CUDA else None
    config = dataclasses.replace(get_paged_decode_config(cap, 128, "int4"), v_pairs=True)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  kv_format="int4", num_splits=num_splits, config=config)
    with poison_empty:
        out = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs, key_outliers=ko)
    assert [la._constexprs["V_PAIRS"] for la in plan._launches.values()] == [True]
    assert not out.isnan().any() and _rel(out, ref) < 2e-3, _rel(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_outlier_keys_quantize_like_random_keys(fmt, dtype):
    """Issue 26 section 2's target: each format's output error (against the float32 attention
    of the original keys) on keys with outlier channels, 8 kept in fp16, within 1.5x of its
    error on random keys without them (bf16 queries included: their keys' values rounded to
    bf16 would not be); today's format on the same keys is several times worse, and random keys
    lose nothing to the side cache."""
    errors = {}
    for kind in ("random", "offset", "scaled", "rope"):
        q, k, v, seqlens, table, calib = _case(kind, dtype, seed=1)
        ref = paged_attention_ref(q.float(), k.float(), v.float(), seqlens, table)[0]
        ko, kq, ks, vq, vs = _store(k, v, fmt, calibrate_outlier_channels(calib))
        with poison_empty:
            out = kvonce.paged_attention(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                         key_outliers=ko, **_fmt_kw(fmt))
        errors["d&s", kind] = _rel(out, ref)
        pq, pks = kvonce.quantize_kv(k, fmt)
        today = kvonce.paged_attention(q, pq, vq, seqlens, table, k_scale=pks, v_scale=vs,
                                       **_fmt_kw(fmt))
        errors["today", kind] = _rel(today, ref)
    base = errors["today", "random"]
    for kind in ("offset", "scaled", "rope"):
        assert errors["d&s", kind] < 1.5 * base, (kind, errors)
        assert errors["today", kind] > 2 * base, (kind, errors)
    assert errors["d&s", "random"] < 1.05 * base, errors


@pytest.mark.parametrize("fmt", FORMATS)
def test_append_splits_and_quantizes(fmt):
    """append_paged_kv(..., key_outliers=) writes the new keys' outlier channels into the side
    cache at their positions (nothing else there changes) and quantize_kv of the keys with
    those channels zeroed into the cache, byte for byte; decode over the result matches the
    same cache built whole."""
    dtype = DTYPES[0]
    q, k, v, seqlens, table, calib = _case("offset", dtype)
    channels = calibrate_outlier_channels(calib)
    batch, heads_k, d, page = q.shape[0], k.shape[2], k.shape[3], k.shape[1]
    ko, kq, ks, vq, vs = _store(k, v, fmt, channels)
    new_len = 3
    new_k = _keys(batch * new_len, heads_k, d, "offset", torch.Generator().manual_seed(5))
    new_k = (new_k - new_k.mean(0) + k.float().reshape(-1, heads_k, d).mean(0).cpu()).to(DEVICE)
    new_k = new_k.reshape(batch, new_len, heads_k, d).to(dtype)
    new_v = torch.randn(batch, new_len, heads_k, d, device=DEVICE).to(dtype)
    start = seqlens.clone()
    start[seqlens == 0] = 4
    rows = [(table[b, (int(start[b]) + i) // page].item(), (int(start[b]) + i) % page)
            for b in range(batch) for i in range(new_len)]
    before = ko.values.clone()
    dense, sparse = ko.split(new_k)
    want_k, want_ks = kvonce.quantize_kv(dense, fmt, scale=ks if fmt == "fp8_e4m3" else None)
    kvonce.append_paged_kv(new_k, new_v, kq, vq, start, table, k_scale=ks, v_scale=vs,
                           key_outliers=ko, **_fmt_kw(fmt))
    got = torch.stack([kq[p, s] for p, s in rows]).reshape(want_k.shape)
    assert torch.equal(got.view(torch.uint8), want_k.view(torch.uint8))
    if fmt != "fp8_e4m3":
        got_s = torch.stack([ks[p, s] for p, s in rows]).reshape(want_ks.shape)
        assert torch.equal(got_s, want_ks.to(got_s.dtype))
    got_v = torch.stack([ko.values[p, s] for p, s in rows]).reshape(sparse.shape)
    assert torch.equal(got_v, sparse)
    touched = torch.zeros(ko.values.shape[:2], dtype=torch.bool, device=DEVICE)
    for p, s in rows:
        touched[p, s] = True
    assert torch.equal(ko.values[~touched], before[~touched])
    # Decode over the appended tokens: the merged keys' attention.
    lens = start + new_len
    out = kvonce.paged_attention(q, kq, vq, lens, table, k_scale=ks, v_scale=vs, key_outliers=ko,
                                 **_fmt_kw(fmt))
    k_seen = ko.merge(kvonce.dequantize_kv(kq, ks, fmt, torch.float32), ko.values.float())
    ref = paged_attention_ref(q.float(), k_seen, kvonce.dequantize_kv(vq, vs, fmt, torch.float32),
                              lens, table)[0]
    assert _rel(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


# (q_len, cache_seqlen): no rows, a decode row, a chunk over a history, a whole prompt, 4 rows
# over 2 keys (two causal rows see no key).
PREFILL_LENS = [(0, 9), (1, 30), (13, 50), (20, 20), (4, 2)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_prefill_is_attention_over_the_merged_keys(fmt):
    """paged_prefill(..., key_outliers=) on a varlen batch (chunk rows, an empty sequence, rows
    that see no key) and PagedPrefillPlan's decode-only route, against the merged keys."""
    dtype = DTYPES[0]
    gen = torch.Generator().manual_seed(3)
    heads, heads_k, d, page = 8, 2, 64, 16
    per_seq = -(-max(max(n, m) for n, m in PREFILL_LENS) // page)
    num_pages = len(PREFILL_LENS) * per_seq + 1
    k = _keys(num_pages * page, heads_k, d, "offset", gen).reshape(num_pages, page, heads_k, d)
    v = torch.randn(num_pages, page, heads_k, d, generator=gen)
    q_lens = [n for n, _ in PREFILL_LENS]
    q = torch.randn(sum(q_lens), heads, d, generator=gen).to(DEVICE).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                      device=DEVICE)
    seqlens = torch.tensor([m for _, m in PREFILL_LENS], dtype=torch.int32, device=DEVICE)
    table = torch.randperm(num_pages, generator=gen)[:len(PREFILL_LENS) * per_seq]
    table = table.reshape(len(PREFILL_LENS), per_seq).to(torch.int32).to(DEVICE)
    k, v = k.to(DEVICE).to(dtype), v.to(DEVICE).to(dtype)
    channels = calibrate_outlier_channels(k)
    ko, kq, ks, vq, vs = _store(k, v, fmt, channels)
    _poison_unused(ko, seqlens, table)
    k_seen = torch.nan_to_num(ko.merge(kvonce.dequantize_kv(kq, ks, fmt, torch.float32),
                                       ko.values.float()))
    v_seen = kvonce.dequantize_kv(vq, vs, fmt, torch.float32)
    ref, ref_lse = paged_prefill_ref(q.float(), k_seen, v_seen, cu, seqlens, table)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, kq, vq, cu, seqlens, table, max_seqlen_q=20,
                                        k_scale=ks, v_scale=vs, return_lse=True,
                                        key_outliers=ko, **_fmt_kw(fmt))
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    assert _rel(out, ref) < tol
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and torch.isneginf(lse).any()
    fin = torch.isfinite(ref_lse)
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-2
    # Decode-only steps route to the decode kernel; the side cache goes along.
    rows = torch.tensor([0, 1, 1, 1, 1], dtype=torch.int32)
    cu1 = torch.tensor([0, *rows.cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q1 = q[:4]
    plan = kvonce.PagedPrefillPlan(q1, kq, vq, cu1, seqlens, table, max_seqlen_q=1, k_scale=ks,
                                   v_scale=vs, **_fmt_kw(fmt))
    assert plan._decode is None  # 4 rows for a batch of 5: the varlen kernel
    got = plan.run(q1, kq, vq, cu1, seqlens, table, k_scale=ks, v_scale=vs, key_outliers=ko)
    want = paged_prefill_ref(q1.float(), k_seen, v_seen, cu1, seqlens, table)[0]
    assert _rel(got, want) < tol
    batch = len(PREFILL_LENS)
    q5 = q[:batch]
    cu5 = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
    plan = kvonce.PagedPrefillPlan(q5, kq, vq, cu5, seqlens, table, max_seqlen_q=1, k_scale=ks,
                                   v_scale=vs, **_fmt_kw(fmt))
    assert plan._decode is not None
    got = plan.run(q5, kq, vq, cu5, seqlens, table, k_scale=ks, v_scale=vs, key_outliers=ko)
    want = paged_prefill_ref(q5.float(), k_seen, v_seen, cu5, seqlens, table)[0]
    assert _rel(got, want) < tol


def test_plan_run_layers_compile_and_opcheck():
    """One PagedDecodePlan, layers with their own side caches; the call compiles with
    fullgraph=True (append included); the decode ops pass opcheck with the outlier arguments."""
    dtype, fmt = DTYPES[0], "int8"
    q, k, v, seqlens, table, calib = _case("offset", dtype)
    channels = calibrate_outlier_channels(calib)
    ko, kq, ks, vq, vs = _store(k, v, fmt, channels)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    for layer in range(2):
        ko_l, kq_l, ks_l, vq_l, vs_l = _store(k * (1 + layer), v, fmt, channels)
        out = plan.run(q, kq_l, vq_l, seqlens, table, k_scale=ks_l, v_scale=vs_l,
                       key_outliers=ko_l)
        k_seen = ko_l.merge(kvonce.dequantize_kv(kq_l, ks_l, fmt, torch.float32),
                            ko_l.values.float())
        ref = paged_attention_ref(q.float(), k_seen, kvonce.dequantize_kv(vq_l, vs_l, fmt,
                                                                          torch.float32),
                                  seqlens, table)[0]
        assert _rel(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)

    new_k = k[:1, :2].expand(q.shape[0], 2, -1, -1).contiguous()
    new_v = v[:1, :2].expand(q.shape[0], 2, -1, -1).contiguous()

    def step(q, new_k, new_v, kq, vq, ks, vs, seqlens, table):
        kvonce.append_paged_kv(new_k, new_v, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                               key_outliers=ko)
        return plan.run(q, kq, vq, seqlens + 2, table, k_scale=ks, v_scale=vs,
                        return_lse=True, key_outliers=ko)

    state = [t.clone() for t in (kq, vq, ks, vs, ko.values)]
    eager = step(q, new_k, new_v, kq, vq, ks, vs, seqlens, table)
    for t, saved in zip((kq, vq, ks, vs, ko.values), state):
        t.copy_(saved)
    compiled = torch.compile(step, fullgraph=True, backend="inductor" if HAS_CUDA else "aot_eager")
    out, lse = compiled(q, new_k, new_v, kq, vq, ks, vs, seqlens, table)
    assert _rel(out, eager[0]) < 1e-3
    fin = torch.isfinite(eager[1])
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - eager[1][fin]).abs().max() < 1e-3

    c = plan.config
    fields = (q.shape[-1] ** -0.5, True, c.block_n, c.num_warps, c.num_stages, c.kv_cache_modifier, c.kv_eviction, c.max_merged_splits, ks, vs, 2,
              c.max_registers, False, c.f16_math, c.int64_kv_offsets, c.v_pairs, ko.values,
              ko.channels)
    torch.library.opcheck(torch.ops.kvonce.paged_decode,
                          (q, kq, vq, seqlens, table, *fields))
    s = 3
    batch, q_len, heads, d = q.shape
    from kvonce.kernels.paged_decode import decode_row_blocks
    o_part = torch.empty((batch, q_len, heads, s, d), dtype=torch.float32, device=DEVICE)
    lse_part = torch.empty((batch, q_len, heads, s), dtype=torch.float32, device=DEVICE)
    arrivals = torch.zeros((batch, k.shape[2], decode_row_blocks(heads, k.shape[2], q_len)[1]),
                           dtype=torch.int32, device=DEVICE)
    torch.library.opcheck(torch.ops.kvonce.paged_decode_split,
                          (q, kq, vq, seqlens, table, o_part, lse_part, arrivals, *fields))
    torch.library.opcheck(torch.ops.kvonce.append_paged_kv,
                          (new_k, new_v, kq, vq, seqlens, table, ks, vs, 2, ko.values,
                           ko.channels))


def test_fp16_values_saturate():
    """Outlier values past fp16's range are stored as +-65504 (saturated, as fp8 is), not inf;
    bf16 values keep them."""
    channels = torch.tensor([[1, 5, 8, 9, 10, 11, 12, 13]], dtype=torch.int32, device=DEVICE)
    k = torch.zeros(2, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k[0, 0, 1], k[1, 0, 5], k[1, 0, 2] = 1e6, -3e5, 7.0
    dense, sparse = new_key_outliers(channels, 1, 16).split(k)
    assert sparse.dtype == torch.float16
    assert sparse[:, 0, :2].flatten().tolist() == [65504.0, 0.0, 0.0, -65504.0]
    assert dense[1, 0, 2] == 7.0 and (dense[:, :, [1, 5]] == 0).all()
    _, kept = new_key_outliers(channels, 1, 16, torch.bfloat16).split(k)
    assert kept[0, 0, 0] == 1e6
    # The append kernel stores the same: fp32 keys into an int8 cache with fp16 values.
    ko = new_key_outliers(channels, 2, 16)
    kq, ks = kvonce.quantize_kv(torch.zeros(2, 16, 1, 32, device=DEVICE), "int8")
    vq, vs = kvonce.quantize_kv(torch.zeros(2, 16, 1, 32, device=DEVICE), "int8")
    table = torch.tensor([[1, 0]], dtype=torch.int32, device=DEVICE)
    kvonce.append_paged_kv(k.float()[None], k.float()[None], kq, vq,
                           torch.tensor([15], dtype=torch.int32, device=DEVICE), table,
                           k_scale=ks, v_scale=vs, key_outliers=ko)
    assert torch.equal(ko.values[1, 15, 0], sparse[0, 0]) and torch.equal(ko.values[0, 0, 0],
                                                                          sparse[1, 0])
    assert torch.equal(kq[1, 15, 0], kvonce.quantize_kv(dense[0].float(), "int8")[0][0])
    assert ko.values.count_nonzero() == 2  # the two slots written, one outlier each


def test_calibration():
    """The n channels of largest calibration magnitude per KV head, ascending, int32."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(512, 2, 64, generator=gen)
    keys[:, 0, [5, 9, 40]] *= 50.0
    keys[:, 1, [1, 63]] += 80.0
    keys[:, 0, [12, 20, 33, 50, 61]] *= 20.0
    channels = calibrate_outlier_channels(keys.to(DEVICE), n=8)
    assert channels.dtype == torch.int32 and channels.shape == (2, 8)
    assert channels[0].tolist() == [5, 9, 12, 20, 33, 40, 50, 61]
    assert {1, 63} <= set(channels[1].tolist())
    assert channels[1].tolist() == sorted(channels[1].tolist())


def test_bad_arguments_raise():
    dtype, fmt = DTYPES[0], "int8"
    q, k, v, seqlens, table, calib = _case("offset", dtype)
    channels = calibrate_outlier_channels(calib)
    ko, kq, ks, vq, vs = _store(k, v, fmt, channels)
    call = lambda **kw: kvonce.paged_attention(q, kq, vq, seqlens, table,  # noqa: E731
                                               k_scale=ks, v_scale=vs, **kw)
    with pytest.raises(ValueError, match="quantized caches"):
        kvonce.paged_attention(q, k, v, seqlens, table, key_outliers=ko)
    other = torch.float32 if dtype != torch.float32 else torch.bfloat16
    with pytest.raises(ValueError, match="float16 or q's dtype"):
        call(key_outliers=new_key_outliers(channels, k.shape[0], k.shape[1], other))
    with pytest.raises(ValueError, match="pages"):
        call(key_outliers=new_key_outliers(channels, k.shape[0] - 1, k.shape[1], dtype))
    with pytest.raises(ValueError, match="< head dim"):
        big = channels.clone()
        big[0, -1] = q.shape[-1]
        call(key_outliers=new_key_outliers(big, k.shape[0], k.shape[1], dtype))
    with pytest.raises(ValueError, match="distinct"):
        dup = channels.clone()
        dup[0, 1] = dup[0, 0]
        new_key_outliers(dup, 4, 16, dtype)
    for n in (4, 17):
        with pytest.raises(ValueError, match="8 or 16"):
            new_key_outliers(torch.arange(n, dtype=torch.int32).expand(2, n).contiguous(), 4,
                             16, dtype)
    heads_k = channels.shape[0]
    with pytest.raises(ValueError, match="multiples of 8"):
        KeyOutliers(channels, torch.zeros(4, 16, heads_k, 9, device=DEVICE)[..., :8])
    with pytest.raises(ValueError, match="aligned"):
        KeyOutliers(channels, torch.zeros(4 * 16 * heads_k * 8 + 1,
                                          device=DEVICE)[1:].view(4, 16, heads_k, 8))
    with pytest.raises(ValueError, match=">= 0"):
        new_key_outliers(channels - 100, 4, 16, dtype)
    with pytest.raises(TypeError):
        new_key_outliers(channels.long(), 4, 16, dtype)
    with pytest.raises(ValueError, match="must be \\[num_pages"):
        KeyOutliers(channels, ko.values[..., :1, :])
    kt = kvonce.calibrate_key_transform(calib.float(), rotate=False)
    with pytest.raises(ValueError, match="one"):
        call(key_outliers=ko, key_transform=kt)
    with pytest.raises(ValueError, match="n must be 8 or 16"):
        calibrate_outlier_channels(calib, n=12)
    new = k[:1, :2].expand(q.shape[0], 2, -1, -1).contiguous()
    with pytest.raises(ValueError, match="quantized caches"):
        kvonce.append_paged_kv(new, new, k.clone(), v.clone(), seqlens, table, key_outliers=ko)
    before = ko.values.clone()
    with pytest.raises(ValueError):  # a bad append argument: nothing is written
        kvonce.append_paged_kv(new, new[..., :-1], kq, vq, seqlens, table, k_scale=ks,
                               v_scale=vs, key_outliers=ko)
    assert torch.equal(ko.values.nan_to_num(), before.nan_to_num())
    assert math.isfinite(float(ks.float().sum()))
