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
from kvonce.reference import paged_attention_ref

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
