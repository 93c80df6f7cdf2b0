"""KeyTransform (kvonce.paged.key_transform): keys centred, smoothed and rotated before they are
stored, queries transformed to match, the LSE corrected. Without quantization the attention is
that of the original keys; with it, keys with outlier channels lose their excess error.

CPU (interpreter): small sizes, fp16/fp32 queries. CUDA: bf16, real head dim.
"""
import pytest
import torch
from conftest import DEVICE, DTYPES, HAS_CUDA, poison_empty

import kvonce
from kvonce.paged import KeyTransform, calibrate_key_transform
from kvonce.paged.key_transform import hadamard
from kvonce.reference import paged_attention_ref, paged_prefill_ref

FORMATS = ("fp8_e4m3", "int8", "int4")


def _keys(n, heads_k, d, outliers: bool, gen):
    """``[n, heads_k, d]`` N(0, 1) keys; with ``outliers``, four channels carry fixed-sign
    offsets of 100/40/20/10 sigma (each KV head its own signs), as real keys' do."""
    k = torch.randn(n, heads_k, d, generator=gen)
    if outliers:
        for ch, size in zip((3, 17, 40, d - 7), (100.0, 40.0, 20.0, 10.0)):
            sign = torch.randint(0, 2, (heads_k,), generator=gen) * 2 - 1
            k[:, :, ch] += size * sign
    return k


def _case(outliers: bool, dtype, seed=0):
    """A paged decode batch: q ``[batch, q_len, heads, d]``, K/V caches (pages in random order),
    seqlens, block table, and calibration keys drawn like the cache's."""
    gen = torch.Generator().manual_seed(seed)
    batch, q_len, heads, heads_k, d, page = (3, 2, 8, 2, 64, 16) if not HAS_CUDA else (
        8, 1, 32, 8, 128, 16)
    lens = [70, 0, 33] if not HAS_CUDA else [1000] * 7 + [17]
    pages_per_seq = -(-max(lens) // page)
    num_pages = batch * pages_per_seq + 2
    k = _keys(num_pages * page, heads_k, d, outliers, gen).reshape(num_pages, page, heads_k, d)
    v = torch.randn(num_pages, page, heads_k, d, generator=gen)
    q = torch.randn(batch, q_len, heads, d, generator=gen)
    table = torch.randperm(num_pages, generator=gen)[:batch * pages_per_seq]
    calib = _keys(2048, heads_k, d, outliers, gen)
    if outliers:  # the calibration keys share the cache's offsets (same generator draws differ)
        calib = calib - calib.mean(0) + k.reshape(-1, heads_k, d).mean(0)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return (to(q).to(dtype), to(k).to(dtype), to(v).to(dtype),
            torch.tensor(lens, dtype=torch.int32, device=DEVICE),
            to(table.reshape(batch, pages_per_seq).to(torch.int32)), to(calib))


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("rotate", [True, False])
def test_plain_cache_attention_is_the_original_keys(rotate):
    """Stored through the transform (no quantization): the output and LSE are those of the
    original keys, GQA included, a row with no keys included (lse -inf, out 0)."""
    dtype = torch.float32
    q, k, v, seqlens, table, calib = _case(True, dtype)
    kt = calibrate_key_transform(calib, rotate=rotate)
    k_stored = kt.keys(k).to(dtype)
    ref, ref_lse = paged_attention_ref(q, k, v, seqlens, table)
    with poison_empty:
        out, lse = kvonce.paged_attention(q, k_stored, v, seqlens, table, return_lse=True,
                                          key_transform=kt)
    err = _rel(out, ref)
    assert err < 1e-4
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-3
    # Without the query transform the same cache gives another answer (the test can fail).
    wrong = kvonce.paged_attention(q, k_stored, v, seqlens, table)
    assert _rel(wrong, ref) > max(1e-2, 100 * err)


@pytest.mark.parametrize("fmt", FORMATS)
def test_outlier_keys_quantize_like_random_keys(fmt):
    """Output error against the float32 attention of the original keys: today's format on keys
    with fixed-sign outlier channels is several times its error on random keys; through the
    transform it is within 1.5x (issue 26's target) of the transformed random keys' error."""
    dtype = DTYPES[0]
    errors = {}
    for outliers in (False, True):
        q, k, v, seqlens, table, calib = _case(outliers, dtype, seed=1)
        ref = paged_attention_ref(q.float(), k.float(), v.float(), seqlens, table)[0]
        vq, vs = kvonce.quantize_kv(v, fmt)
        kt = calibrate_key_transform(calib)
        for name, keys, transform in (("plain", k, None), ("transform", kt.keys(k), kt)):
            kq, ks = kvonce.quantize_kv(keys, fmt)
            with poison_empty:
                out = kvonce.paged_attention(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                             kv_format="int4" if fmt == "int4" else None,
                                             key_transform=transform)
            errors[name, outliers] = _rel(out, ref)
    assert errors["plain", True] > 3 * errors["plain", False], errors
    assert errors["transform", True] < 1.5 * errors["transform", False], errors
    assert errors["transform", False] < 1.3 * errors["plain", False], errors


@pytest.mark.parametrize("fmt", FORMATS)
def test_append_stores_the_transformed_keys(fmt):
    """append_paged_kv(..., key_transform=) writes quantize_kv(key_transform.keys(k)), byte for
    byte; a plain cache gets the transformed keys in its dtype."""
    dtype = DTYPES[0]
    q, k, v, seqlens, table, calib = _case(True, dtype)
    kt = calibrate_key_transform(calib)
    batch, heads_k, d = q.shape[0], k.shape[2], k.shape[3]
    new_k = torch.randn(batch, 3, heads_k, d, device=DEVICE).to(dtype) + k.reshape(-1, heads_k, d).mean(0)
    new_v = torch.randn(batch, 3, heads_k, d, device=DEVICE).to(dtype)
    start = torch.tensor([5, 0, 20], dtype=torch.int32, device=DEVICE)[:batch] if not HAS_CUDA \
        else torch.arange(batch, dtype=torch.int32, device=DEVICE) * 3
    page = k.shape[1]
    rows = [(table[b, (int(start[b]) + i) // page].item(), (int(start[b]) + i) % page)
            for b in range(batch) for i in range(3)]
    want_k, want_ks = kvonce.quantize_kv(kt.keys(new_k), fmt)
    kq, ks = kvonce.quantize_kv(kt.keys(k), fmt)
    vq, vs = kvonce.quantize_kv(v, fmt)
    if fmt == "fp8_e4m3":
        want_k, _ = kvonce.quantize_kv(kt.keys(new_k), fmt, scale=ks)
    kvonce.append_paged_kv(new_k, new_v, kq, vq, start, table, k_scale=ks, v_scale=vs,
                           kv_format="int4" if fmt == "int4" else None, key_transform=kt)
    got = torch.stack([kq[p, s] for p, s in rows]).reshape(want_k.shape)
    assert torch.equal(got.view(torch.uint8), want_k.view(torch.uint8))
    if fmt != "fp8_e4m3":
        got_s = torch.stack([ks[p, s] for p, s in rows]).reshape(want_ks.shape)
        assert torch.equal(got_s, want_ks.to(got_s.dtype))
    plain = k.clone()
    kvonce.append_paged_kv(new_k, new_v, plain, v.clone(), start, table, key_transform=kt)
    got = torch.stack([plain[p, s] for p, s in rows]).reshape(new_k.shape)
    assert torch.equal(got, kt.keys(new_k).to(dtype))


def test_plan_run_and_compile():
    """PagedDecodePlan.run takes the transform per call (one plan, layers with their own
    transforms), and the call compiles with fullgraph=True."""
    dtype = DTYPES[0]
    q, k, v, seqlens, table, calib = _case(True, dtype)
    plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table)
    for layer in range(2):
        kt = calibrate_key_transform(calib * (1 + layer), alpha=0.5 + 0.25 * layer)
        k_stored = kt.keys(k * (1 + layer)).to(dtype)
        out, lse = plan.run(q, k_stored, v, seqlens, table, return_lse=True, key_transform=kt)
        ref, ref_lse = paged_attention_ref(q.float(), (k * (1 + layer)).float(), v.float(),
                                           seqlens, table)
        assert _rel(out, ref) < (1e-4 if dtype == torch.float32 else 2e-2)

    def step(q, k_stored, v, seqlens, table):
        return plan.run(q, k_stored, v, seqlens, table, return_lse=True, key_transform=kt)

    eager = step(q, k_stored, v, seqlens, table)
    compiled = torch.compile(step, fullgraph=True, backend="inductor" if HAS_CUDA else "aot_eager")
    out, lse = compiled(q, k_stored, v, seqlens, table)
    assert _rel(out, eager[0]) < 1e-3
    fin = torch.isfinite(eager[1])
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - eager[1][fin]).abs().max() < 1e-3


def test_calibration():
    """c is the mean; s positive, geometric mean 1 per head, tied across rotary pairs, all ones
    at alpha 0; the Hadamard is orthonormal."""
    gen = torch.Generator().manual_seed(0)
    keys = _keys(512, 2, 64, True, gen)
    keys[:, :, 9] *= 30.0                               # a channel of large spread
    keys = keys.to(DEVICE)
    kt = calibrate_key_transform(keys, alpha=0.75)
    assert torch.allclose(kt.centre, keys.mean(0), atol=1e-2, rtol=1e-3)
    assert (kt.smooth > 0).all()
    assert torch.allclose(kt.smooth.log().mean(-1), torch.zeros(2, device=DEVICE), atol=2e-3)
    assert torch.equal(kt.smooth[:, :32], kt.smooth[:, 32:])
    # The spread channel (and its rotary partner) is smoothed most; fixed offsets are the
    # centre's job (channel 3's 100-sigma offset leaves it an ordinary spread).
    assert kt.smooth[0, 9] > 5 * kt.smooth[0, 5] and kt.smooth[0, 9] > 5 * kt.smooth[0, 3]
    untied = calibrate_key_transform(keys, rope_pairs=False)
    assert not torch.equal(untied.smooth[:, :32], untied.smooth[:, 32:])
    flat = calibrate_key_transform(keys, alpha=0.0)
    assert torch.equal(flat.smooth, torch.ones_like(flat.smooth))
    h = hadamard(64, DEVICE)
    assert torch.allclose(h @ h.T, torch.eye(64, device=DEVICE), atol=1e-6)


def test_bad_arguments_raise():
    gen = torch.Generator().manual_seed(0)
    keys = _keys(64, 2, 64, False, gen).to(DEVICE)
    kt = calibrate_key_transform(keys)
    with pytest.raises(ValueError, match="power-of-two"):
        calibrate_key_transform(torch.randn(8, 2, 96, device=DEVICE))
    calibrate_key_transform(torch.randn(8, 2, 96, device=DEVICE), rotate=False)  # allowed
    with pytest.raises(ValueError, match="at least one"):
        calibrate_key_transform(keys[:0])
    with pytest.raises(ValueError, match="alpha"):
        calibrate_key_transform(keys, alpha=1.5)
    with pytest.raises(ValueError, match="multiple of 2"):
        kt.queries(torch.randn(1, 3, 64, device=DEVICE))
    with pytest.raises(ValueError, match="expected 2"):
        kt.keys(torch.randn(1, 4, 64, device=DEVICE))
    with pytest.raises(ValueError, match="64"):
        kt.keys(torch.randn(1, 2, 32, device=DEVICE))
    with pytest.raises(ValueError, match="both be"):
        KeyTransform(kt.centre, kt.smooth[:1])
    with pytest.raises(TypeError, match="float32"):
        KeyTransform(kt.centre.half(), kt.smooth)


# ------------------------------------------------------------------------------------------------
# Varlen prefill (paged_prefill, PagedPrefillPlan.run) and the flash-attn names
# ------------------------------------------------------------------------------------------------

# (q_len, cache_seqlen) per sequence: no rows, a decode row, a chunk over a history, a whole
# prompt, and 4 rows over 2 keys (outside the contract: its first two causal rows see no key and
# get lse -inf).
PREFILL_LENS = [(0, 9), (1, 30), (13, 50), (20, 20), (4, 2)]


def _prefill_case(lens, dtype, seed=0, nheads=8, nheads_k=2, d=64, page=16):
    """``(q [total_q, nheads, d], k, v caches holding outlier keys, cu_seqlens_q, cache_seqlens,
    block_table, calibration keys)``; pages in random order, room for each sequence's
    ``max(q_len, cache_seqlen)`` positions."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-max(max(n, m) for n, m in lens) // page)
    num_pages = len(lens) * per_seq + 1
    k = _keys(num_pages * page, nheads_k, d, True, gen).reshape(num_pages, page, nheads_k, d)
    v = torch.randn(num_pages, page, nheads_k, d, generator=gen)
    q_lens = [n for n, _ in lens]
    q = torch.randn(sum(q_lens), nheads, d, generator=gen)
    table = torch.randperm(num_pages, generator=gen)[:len(lens) * per_seq]
    calib = _keys(1024, nheads_k, d, True, gen)
    calib = calib - calib.mean(0) + k.reshape(-1, nheads_k, d).mean(0)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seqlens = torch.tensor([m for _, m in lens], dtype=torch.int32)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return (to(q).to(dtype), to(k).to(dtype), to(v).to(dtype), to(cu), to(seqlens),
            to(table.reshape(len(lens), per_seq).to(torch.int32)), to(calib))


def _check_lse(lse, ref, tol):
    assert not torch.isnan(lse).any()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "-inf rows differ"
    fin = torch.isfinite(ref)
    assert (lse[fin] - ref[fin]).abs().max() < tol


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_plain_cache_is_the_original_keys(dtype, causal):
    """paged_prefill(..., key_transform=) over keys stored through the transform (no
    quantization) gives the output and LSE of paged_prefill over the original keys, on a varlen
    batch with an empty sequence, chunk rows and (causal) rows that see no key."""
    q, k, v, cu, seqlens, table, calib = _prefill_case(PREFILL_LENS, dtype)
    kt = calibrate_key_transform(calib)
    k_stored = kt.keys(k).to(dtype)
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                                     causal=causal)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, k_stored, v, cu, seqlens, table, max_seqlen_q=20,
                                        causal=causal, return_lse=True, key_transform=kt)
        plain, plain_lse = kvonce.paged_prefill(q, k, v, cu, seqlens, table, max_seqlen_q=20,
                                                causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    assert torch.isneginf(lse).any() == causal
    # Against the float32 attention of the original keys: within test_paged_prefill's bound, and
    # as close as kvonce on those keys up to the rounding of q' (fp16 on CPU: 2.8e-4 vs 2.1e-4).
    err, plain_err = _rel(out, ref), _rel(plain, ref)
    assert err < {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]
    assert err < max(1e-5, 3 * plain_err), (err, plain_err)
    lse_tol = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    _check_lse(lse, ref_lse, lse_tol)
    _check_lse(lse, plain_lse, lse_tol)
    # Without the query transform (or without the LSE correction) another answer.
    wrong, wrong_lse = kvonce.paged_prefill(q, k_stored, v, cu, seqlens, table, max_seqlen_q=20,
                                            causal=causal, return_lse=True)
    assert _rel(wrong, ref) > max(1e-2, 100 * err)
    fin = torch.isfinite(ref_lse)
    assert (wrong_lse[fin] - ref_lse[fin]).abs().max() > 1.0


def test_prefill_plan_run_layers_and_decode_rows():
    """PagedPrefillPlan.run takes each layer's transform; a decode-only step (routed to the
    decode kernel, whose LSE is laid out [batch, h, 1]) gets the same correction, a sequence with
    no keys keeping lse -inf."""
    dtype = DTYPES[0]
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    q, k, v, cu, seqlens, table, calib = _prefill_case(PREFILL_LENS[:4], dtype, seed=1)
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=20)
    for layer in range(2):
        kt = calibrate_key_transform(calib * (1 + layer), alpha=0.5 + 0.25 * layer)
        k_layer = k * (1 + layer)
        with poison_empty:
            out, lse = plan.run(q, kt.keys(k_layer).to(dtype), v, cu, seqlens, table,
                                return_lse=True, key_transform=kt)
        ref, ref_lse = paged_prefill_ref(q.float(), k_layer.float(), v.float(), cu, seqlens,
                                         table)
        assert _rel(out, ref) < tol
        _check_lse(lse, ref_lse, 1e-3 if dtype == torch.float32 else 5e-2)
    lens = [(1, 40), (1, 0), (1, 17)]
    q, k, v, cu, seqlens, table, calib = _prefill_case(lens, dtype, seed=2)
    kt = calibrate_key_transform(calib)
    k_stored = kt.keys(k).to(dtype)
    plan = kvonce.PagedPrefillPlan(q, k_stored, v, cu, seqlens, table, max_seqlen_q=1)
    assert plan._decode is not None
    with poison_empty:
        out, lse = plan.run(q, k_stored, v, cu, seqlens, table, return_lse=True,
                            key_transform=kt)
        only_out = plan.run(q, k_stored, v, cu, seqlens, table, key_transform=kt)
    want, want_lse = kvonce.paged_attention(q[:, None], k_stored, v, seqlens, table,
                                            return_lse=True, key_transform=kt)
    torch.testing.assert_close(out, want[:, 0], atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, want_lse[:, :, 0].T, atol=1e-4, rtol=0)
    assert torch.equal(only_out, out)
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table)
    assert _rel(out, ref) < tol
    assert torch.isneginf(lse[:, 1]).all() and (out[1] == 0).all()
    _check_lse(lse, ref_lse, 1e-3 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_prefill_quantized_cache_through_append(fmt):
    """Keys appended through the transform into a quantized cache (append_paged_kv(...,
    key_transform=)); paged_prefill(..., key_transform=) is attention of the transformed queries
    over the dequantized stored keys, its LSE shifted by scale * q.c, and it is far closer to
    the original keys' attention than the same format without the transform."""
    dtype = DTYPES[0]
    q, k, v, cu, seqlens, table, calib = _prefill_case(PREFILL_LENS[:4], dtype, seed=3)
    kt = calibrate_key_transform(calib)
    batch, page, heads_k, d = table.shape[0], k.shape[1], k.shape[2], k.shape[3]
    length = table.shape[1] * page
    k_seq, v_seq = k[table.long()].reshape(batch, length, heads_k, d), \
        v[table.long()].reshape(batch, length, heads_k, d)
    kw = dict(kv_format="int4" if fmt == "int4" else None)

    def cache(keys, transform):
        """Every sequence's positions written by one append; fp8 scales from calibration."""
        kq, ks = kvonce.quantize_kv(keys, fmt)
        vq, vs = kvonce.quantize_kv(v, fmt)
        if fmt == "fp8_e4m3":
            cal = calib if transform is None else transform.keys(calib)
            ks = kvonce.quantize_kv(cal, fmt)[1]
        kq.view(torch.uint8).zero_()
        start = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
        kvonce.append_paged_kv(k_seq, v_seq, kq, vq, start, table, k_scale=ks, v_scale=vs,
                               key_transform=transform, **kw)
        return kq, ks, vq, vs

    kq, ks, vq, vs = cache(kt.keys(k), kt)
    with poison_empty:
        out, lse = kvonce.paged_prefill(q, kq, vq, cu, seqlens, table, max_seqlen_q=20,
                                        k_scale=ks, v_scale=vs, return_lse=True,
                                        key_transform=kt, **kw)
    kd = kvonce.dequantize_kv(kq, ks, fmt, torch.float32)
    vd = kvonce.dequantize_kv(vq, vs, fmt, torch.float32)
    # The stored keys (the table's pages) are the transformed ones, not the originals.
    used = table.long().flatten()
    assert _rel(kd[used], kt.keys(k)[used]) < 0.2 and _rel(kd[used], k[used]) > 0.5
    want, want_lse = paged_prefill_ref(kt.queries(q).float(), kd, vd, cu, seqlens, table)
    want_lse = want_lse + kt.lse_offset(q, d ** -0.5).t()
    assert _rel(out, want) < (1e-4 if dtype == torch.float32 else 2e-2)
    _check_lse(lse, want_lse, 1e-3 if dtype == torch.float32 else 5e-2)
    wrong = kvonce.paged_prefill(q, kq, vq, cu, seqlens, table, max_seqlen_q=20, k_scale=ks,
                                 v_scale=vs, **kw)
    assert _rel(wrong, want) > 0.1
    # The point of it: closer to the float32 attention of the original keys than today's format.
    ref = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table)[0]
    pq, pks, pvq, pvs = cache(k, None)
    today = kvonce.paged_prefill(q, pq, pvq, cu, seqlens, table, max_seqlen_q=20, k_scale=pks,
                                 v_scale=pvs, **kw)
    assert 2 * _rel(out, ref) < _rel(today, ref), (_rel(out, ref), _rel(today, ref))


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_names_take_key_transform(causal):
    """flash_attn_with_kvcache(k=, v=, key_transform=) over a cache of transformed keys (plain
    fp32) equals the call without it over the original keys (the new tokens appended through the
    transform); flash_attn_varlen_func(block_table=, key_transform=) is paged_prefill's."""
    dtype = torch.float32
    q, k, v, seqlens, table, calib = _case(True, dtype, seed=2)
    kt = calibrate_key_transform(calib)
    batch, heads_k, d = q.shape[0], k.shape[2], k.shape[3]
    gen = torch.Generator().manual_seed(5)
    new_k = (torch.randn(batch, 2, heads_k, d, generator=gen).to(DEVICE)
             + k.reshape(-1, heads_k, d).mean(0))
    new_v = torch.randn(batch, 2, heads_k, d, generator=gen).to(DEVICE)
    k_plain, v_plain = k.clone(), v.clone()
    k_stored, v_stored = kt.keys(k), v.clone()
    with poison_empty:
        want, want_lse = kvonce.flash_attn_with_kvcache(
            q, k_plain, v_plain, k=new_k, v=new_v, cache_seqlens=seqlens, block_table=table,
            causal=causal, return_softmax_lse=True)
        out, lse = kvonce.flash_attn_with_kvcache(
            q, k_stored, v_stored, k=new_k, v=new_v, cache_seqlens=seqlens, block_table=table,
            causal=causal, return_softmax_lse=True, key_transform=kt)
    assert torch.equal(k_stored, kt.keys(k_plain))  # the new keys went in transformed
    err = _rel(out, want)
    assert err < 1e-4
    _check_lse(lse, want_lse, 1e-3)
    wrong = kvonce.flash_attn_with_kvcache(q, k_stored, v_stored, cache_seqlens=seqlens + 2,
                                           block_table=table, causal=causal)
    assert _rel(wrong, want) > max(1e-2, 100 * err)
    # The varlen name on the same cache, its rows the newest of each sequence.
    q_rows = q.reshape(-1, *q.shape[2:])
    lens = seqlens + 2
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE) * q.shape[1]
    cu_k = torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(torch.int32)
    with poison_empty:
        got, got_lse, _ = kvonce.flash_attn_varlen_func(
            q_rows, k_stored, v_stored, cu_q, cu_k, q.shape[1], int(lens.max()), causal=causal,
            block_table=table, return_attn_probs=True, key_transform=kt)
        pp, pp_lse = kvonce.paged_prefill(q_rows, k_stored, v_stored, cu_q, lens, table,
                                          max_seqlen_q=q.shape[1], causal=causal,
                                          return_lse=True, key_transform=kt)
    assert torch.equal(got, pp) and torch.equal(got_lse, pp_lse)
    ref, ref_lse = paged_prefill_ref(q_rows, k_plain, v_plain, cu_q, lens, table, causal=causal)
    assert _rel(got, ref) < 1e-4
    _check_lse(got_lse, ref_lse, 1e-3)


def test_key_transform_needs_a_paged_cache():
    q, k, v, seqlens, table, calib = _case(False, torch.float32)
    kt = calibrate_key_transform(calib)
    with pytest.raises(ValueError, match="key_transform.*block_table"):
        kvonce.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, key_transform=kt)
    rows = q.reshape(-1, *q.shape[2:])
    keys = k.reshape(-1, *k.shape[2:])
    cu = torch.tensor([0, rows.shape[0]], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, keys.shape[0]], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="key_transform.*block_table"):
        kvonce.flash_attn_varlen_func(rows, keys, keys, cu, cu_k, rows.shape[0], keys.shape[0],
                                      key_transform=kt)
