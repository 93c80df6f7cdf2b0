"""Paged decode (kvonce.paged) against the float32 references.

On CPU these run under the Triton interpreter (TRITON_INTERPRET=1) with fp16/fp32 only (the
interpreter's bf16 tl.dot is wrong) and small shapes; GPU-only tests (bf16, real sizes, CUDA-graph
capture) are marked. Each kvonce call runs under ``poison_empty``: its outputs and scratch buffers
are allocated NaN-filled, so an element the kernels fail to write shows up as a NaN.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import DEVICE, poison_empty

import kvonce.paged.decode as decode
from kvonce import append_paged_kv, quantize_kv
from kvonce.paged import flash_attn_with_kvcache, merge_attention_states, paged_attention
from kvonce.paged._alloc import allocator
from kvonce.paged.splits import MAX_SPLITS
from kvonce.kernels.configs import interpreter_active
from kvonce.reference import (attention_ref, merge_attention_states_ref, paged_attention_ref,
                              paged_attention_sdpa_ref)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
pytestmark = pytest.mark.skipif(not CUDA and not interpreter_active(),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")
gpu_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (bf16, real sizes, CUDA graphs)")
# Relative error bounds (||out - ref|| / ||ref||) against float32 references. On the GPU a
# float32 tl.dot runs in tf32 (measured ~7e-4 on H100), under the interpreter in true float32.
TOL = {torch.float32: 2e-3 if CUDA else 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LSE_TOL = 5e-3 if CUDA else 1e-3
# Split counts change the tile boundaries, hence the tf32 rounding of p @ v on the GPU.
SPLIT_TOL = 2e-4 if CUDA else 1e-5


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    assert not torch.isnan(out).any(), "output has NaNs (an element was not written)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def lse_err(lse: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs difference of two LSEs whose -inf entries (rows with no key) must coincide."""
    assert not torch.isnan(lse).any(), "lse has NaNs (an element was not written)"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "-inf rows differ"
    finite = torch.isfinite(ref)
    return (lse[finite] - ref[finite].to(lse.device)).abs().max().item() if finite.any() else 0.0


def test_poison_empty_is_scoped_and_catches_unwritten_elements():
    """The harness itself: inside ``with poison_empty`` (nested too) torch.empty / empty_like and
    the paged package's allocator give NaN-filled floats, integer tensors untouched; after it the
    real functions are back; and a row a (deliberately wrong) kernel leaves unwritten fails
    rel_err."""
    real = (torch.empty, torch.empty_like, allocator.empty)
    x = torch.randn(4, 3, device=DEVICE)

    def forgets_last_row(x):
        out = allocator.empty(x.shape, dtype=x.dtype, device=x.device)
        out[:-1] = x[:-1]
        return out

    with poison_empty:
        assert torch.isnan(torch.empty(3, device=DEVICE)).all()
        assert torch.isnan(torch.empty_like(x)).all()
        assert torch.empty(3, dtype=torch.int32, device=DEVICE).dtype == torch.int32
        with poison_empty:
            assert torch.isnan(allocator.empty((2, 2), device=DEVICE)).all()
        assert torch.isnan(allocator.empty((2, 2), device=DEVICE)).all()
        out = forgets_last_row(x)
    assert (torch.empty, torch.empty_like, allocator.empty) == real
    assert torch.equal(out[:-1], x[:-1]) and torch.isnan(out[-1]).all()
    with pytest.raises(AssertionError, match="an element was not written"):
        rel_err(out, x)


def make_paged(lens, *, page_size, nheads_k, head_dim, dtype, spare_pages=2, seed=0):
    """A cache whose pages are a random permutation; each sequence gets the pages it needs plus
    ``spare_pages`` (room to append), the table padded with the last page index."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) + spare_pages for n in lens]
    max_pages = max(need)
    num_pages = sum(need) + 3  # a few pages nobody uses
    perm = torch.randperm(num_pages, generator=g)
    table = torch.full((len(lens), max_pages), num_pages - 1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[start:start + n].to(torch.int32)
        start += n
    shape = (num_pages, page_size, nheads_k, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=g).to(dtype).to(DEVICE)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return k_cache, v_cache, seqlens, table.to(DEVICE)


def make_q(batch, q_len, nheads, head_dim, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch, q_len, nheads, head_dim), generator=g).to(dtype).to(DEVICE)


# ------------------------------------------------------------------------------------------------
# Against both references
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("page_size,head_dim,nheads,nheads_k", [
    (16, 64, 4, 4),      # MHA
    (16, 128, 4, 2),     # GQA 2
    (32, 64, 8, 2),      # GQA 4
    (16, 96, 6, 1),      # GQA 6 as MQA, head dim 96 (masked head dim)
    (64, 64, 12, 2),     # GQA 6
    (128, 64, 8, 1),     # GQA 8 / MQA
    (256, 32, 2, 2),
    (16, 256, 2, 1),
])
def test_against_references(dtype, page_size, head_dim, nheads, nheads_k):
    # Lengths: 1, exactly a page, not a multiple of the page size, past a page border.
    lens = [1, page_size, page_size + 5, 2 * page_size + 3]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=page_size, nheads_k=nheads_k,
                                                  head_dim=head_dim, dtype=dtype)
    q = make_q(len(lens), 1, nheads, head_dim, dtype)
    ref_o, ref_lse = paged_attention_ref(q, k_cache, v_cache, seqlens, table)
    sdpa_o = paged_attention_sdpa_ref(q, k_cache, v_cache, seqlens, table)
    assert rel_err(sdpa_o, ref_o) < 1e-5
    for num_splits in (1, 3, 0):
        with poison_empty:
            out, lse = paged_attention(q, k_cache, v_cache, seqlens, table,
                                       num_splits=num_splits, return_lse=True)
        assert out.dtype == dtype and out.shape == q.shape
        assert lse.dtype == torch.float32 and lse.shape == (len(lens), nheads, 1)
        err = rel_err(out, ref_o)
        assert err < TOL[dtype], f"num_splits={num_splits}: rel err {err:.2e} vs simple ref"
        assert rel_err(out, sdpa_o) < TOL[dtype]
        assert lse_err(lse, ref_lse) < LSE_TOL


def test_forced_num_splits_1_to_16_agree():
    dtype = torch.float32
    lens = [70, 23, 1, 48]  # with BLOCK_N=16 (interpreter) many splits are empty for short rows
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=2, head_dim=32,
                                                  dtype=dtype)
    q = make_q(4, 2, 4, 32, dtype)
    ref_o, ref_lse = paged_attention_ref(q, k_cache, v_cache, seqlens, table)
    with poison_empty:
        base, base_lse = paged_attention(q, k_cache, v_cache, seqlens, table, num_splits=1,
                                         return_lse=True)
    assert rel_err(base, ref_o) < TOL[dtype]
    for s in range(2, 17):
        with poison_empty:
            out, lse = paged_attention(q, k_cache, v_cache, seqlens, table, num_splits=s,
                                       return_lse=True)
        assert rel_err(out, base) < SPLIT_TOL, f"num_splits={s} differs from num_splits=1"
        assert lse_err(lse, base_lse) < 10 * SPLIT_TOL, f"num_splits={s}: lse differs"


@pytest.mark.parametrize("q_len", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_q_len(q_len, causal):
    dtype = torch.float16
    # 3 < q_len for some q_len: the first rows then see no key (out 0, lse -inf) when causal.
    lens = [3, 40, 17]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=2, head_dim=64,
                                                  dtype=dtype, seed=q_len)
    q = make_q(3, q_len, 8, 64, dtype, seed=q_len)
    ref_o, ref_lse = paged_attention_ref(q, k_cache, v_cache, seqlens, table, causal=causal)
    sdpa_o = paged_attention_sdpa_ref(q, k_cache, v_cache, seqlens, table, causal=causal)
    for num_splits in (1, 2):
        with poison_empty:
            out, lse = paged_attention(q, k_cache, v_cache, seqlens, table, causal=causal,
                                       num_splits=num_splits, return_lse=True)
        assert rel_err(out, ref_o) < TOL[dtype]
        assert rel_err(out, sdpa_o) < TOL[dtype]
        assert lse_err(lse, ref_lse) < LSE_TOL
        if causal and q_len > 3:
            assert (out[0, : q_len - 3] == 0).all()


def test_softmax_scale_and_strided_q():
    dtype = torch.float32
    k_cache, v_cache, seqlens, table = make_paged([33, 9], page_size=16, nheads_k=1, head_dim=64,
                                                  dtype=dtype)
    q_big = make_q(2, 1, 4, 128, dtype)
    q = q_big[..., :64]  # strided over heads and tokens, unit last-dim stride
    ref_o, _ = paged_attention_ref(q, k_cache, v_cache, seqlens, table, softmax_scale=0.3)
    with poison_empty:
        out = paged_attention(q, k_cache, v_cache, seqlens, table, softmax_scale=0.3,
                              num_splits=2)
    assert rel_err(out, ref_o) < TOL[dtype]


# ------------------------------------------------------------------------------------------------
# Append, then attend
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("new_len", [1, 4])
def test_append_then_attend(new_len):
    dtype = torch.float16
    lens = [15, 16, 30]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=2, head_dim=64,
                                                  dtype=dtype)
    g = torch.Generator().manual_seed(7)
    k_new = torch.randn((3, new_len, 2, 64), generator=g).to(dtype).to(DEVICE)
    v_new = torch.randn((3, new_len, 2, 64), generator=g).to(dtype).to(DEVICE)
    q = make_q(3, new_len, 4, 64, dtype)
    # The dense truth: each sequence's old keys (read through the table) + the new ones.
    dense = []
    for b, n in enumerate(lens):
        pages = table[b].long()
        k_old = k_cache[pages].reshape(-1, 2, 64)[:n]
        v_old = v_cache[pages].reshape(-1, 2, 64)[:n]
        dense.append((torch.cat([k_old, k_new[b]]), torch.cat([v_old, v_new[b]])))
    kc2, vc2 = k_cache.clone(), v_cache.clone()
    with poison_empty:
        append_paged_kv(k_new, v_new, k_cache, v_cache, seqlens, table)
    assert seqlens.tolist() == lens, "append must not advance cache_seqlens"
    with poison_empty:
        out = paged_attention(q, k_cache, v_cache, seqlens + new_len, table)
    for b in range(3):
        ref_o, _ = attention_ref(q[b], *dense[b])
        assert rel_err(out[b], ref_o) < TOL[dtype]
    # The same through the flash-attn wrapper (append + attend in one call).
    with poison_empty:
        out2, lse2 = flash_attn_with_kvcache(q, kc2, vc2, k=k_new, v=v_new, cache_seqlens=seqlens,
                                             block_table=table, causal=True,
                                             return_softmax_lse=True)
    assert torch.equal(kc2, k_cache) and torch.equal(vc2, v_cache)
    assert torch.equal(out2, out)
    assert lse2.shape == (3, 4, new_len)


@pytest.mark.parametrize("nheads_k,head_dim,page_size", [(3, 96, 16), (1, 32, 32), (8, 128, 16)])
def test_append_writes_exactly_its_slots(nheads_k, head_dim, page_size):
    """The append kernel against plain PyTorch indexing: every new token lands in its page slot
    (crossing page borders, odd head counts and dims, strided new K/V) and nothing else moves."""
    lens, new_len = [5, page_size - 1, 2 * page_size], 3
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=page_size, nheads_k=nheads_k,
                                                  head_dim=head_dim, dtype=torch.float16)
    g = torch.Generator().manual_seed(11)
    kv_new = torch.randn((3, new_len, 2 * nheads_k, head_dim), generator=g).half().to(DEVICE)
    k_new, v_new = kv_new[:, :, :nheads_k], kv_new[:, :, nheads_k:]  # strided views
    want_k, want_v = k_cache.clone(), v_cache.clone()
    pos = seqlens.long()[:, None] + torch.arange(new_len, device=DEVICE)[None, :]
    page = torch.gather(table.long(), 1, pos // page_size)
    want_k[page, pos % page_size] = k_new
    want_v[page, pos % page_size] = v_new
    with poison_empty:
        append_paged_kv(k_new, v_new, k_cache, v_cache, seqlens, table)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


# ------------------------------------------------------------------------------------------------
# Merge
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_merge_attention_states(dtype):
    g = torch.Generator().manual_seed(3)
    n, h, d = 5, 3, 96
    o_a = torch.randn((n, h, d), generator=g).to(dtype).to(DEVICE)
    o_b = torch.randn((n, h, d), generator=g).to(dtype).to(DEVICE)
    lse_a = (3 * torch.randn((n, h), generator=g)).to(DEVICE)
    lse_b = (3 * torch.randn((n, h), generator=g)).to(DEVICE)
    lse_a[0, 0] = float("-inf")                      # a empty: b comes back as it is
    lse_b[1, 2] = float("-inf")                      # b empty
    lse_a[2, 1] = lse_b[2, 1] = float("-inf")        # both empty: (0, -inf)
    with poison_empty:
        o, lse = merge_attention_states(o_a, lse_a, o_b, lse_b)
    ref_o, ref_lse = merge_attention_states_ref(o_a, lse_a, o_b, lse_b)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert rel_err(o, ref_o) < TOL[dtype]
    assert torch.equal(o[0, 0], o_b[0, 0]) and lse[0, 0] == lse_b[0, 0]
    assert torch.equal(o[1, 2], o_a[1, 2]) and lse[1, 2] == lse_a[1, 2]
    assert (o[2, 1] == 0).all() and lse[2, 1] == float("-inf")
    assert lse_err(lse, ref_lse) < 1e-5


def test_merge_of_two_halves_equals_whole():
    """Cascade use: attention over keys [0, 20) merged with [20, 45) equals attention over all."""
    dtype = torch.float32
    k_cache, v_cache, seqlens, table = make_paged([45, 45], page_size=16, nheads_k=2, head_dim=64,
                                                  dtype=dtype)
    q = make_q(2, 1, 4, 64, dtype)
    whole, _ = paged_attention_ref(q, k_cache, v_cache, seqlens, table)
    # First part: the first 20 keys. Second part: keys 20..44, as a sequence of 25 keys whose
    # table starts 20 keys in (page 1 offset 4 is not page aligned, so use the reference).
    with poison_empty:
        o1, l1 = paged_attention(q, k_cache, v_cache, torch.full_like(seqlens, 20), table,
                                 causal=False, return_lse=True)
    ks = [k_cache[table[b].long()].reshape(-1, 2, 64)[20:45] for b in range(2)]
    vs = [v_cache[table[b].long()].reshape(-1, 2, 64)[20:45] for b in range(2)]
    parts = [attention_ref(q[b], ks[b], vs[b], causal=False) for b in range(2)]
    o2 = torch.stack([p[0] for p in parts])            # [2, 1, 4, 64]
    l2 = torch.stack([p[1] for p in parts])            # [2, 4, 1]
    with poison_empty:
        o, _ = merge_attention_states(o1[:, 0], l1[..., 0], o2[:, 0].contiguous(), l2[..., 0])
    assert rel_err(o, whole[:, 0]) < TOL[dtype]


# ------------------------------------------------------------------------------------------------
# Bad inputs
# ------------------------------------------------------------------------------------------------

def _good():
    k_cache, v_cache, seqlens, table = make_paged([20, 5], page_size=16, nheads_k=2, head_dim=64,
                                                  dtype=torch.float16)
    return dict(q=make_q(2, 1, 4, 64, torch.float16), k_cache=k_cache, v_cache=v_cache,
                cache_seqlens=seqlens, block_table=table)


@pytest.mark.parametrize("change,exc,match", [
    (lambda a: a.update(q=a["q"][0]), ValueError, "q must have 4 dims"),
    (lambda a: a.update(q=a["q"].float()), TypeError, "q has dtype"),
    (lambda a: a.update(q=a["q"].to(torch.int32)), TypeError, "q must be one of"),
    (lambda a: a.update(k_cache=a["k_cache"][:, :8], v_cache=a["v_cache"][:, :8]), ValueError,
     "page size"),
    (lambda a: a.update(v_cache=a["v_cache"][:, :, :1]), ValueError, "v_cache must have"),
    (lambda a: a.update(block_table=a["block_table"].long()), TypeError, "block_table"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"][:1]), ValueError, "cache_seqlens"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), TypeError, "cache_seqlens"),
    (lambda a: a.update(q=a["q"][:, :, :3]), ValueError, "nheads"),
    (lambda a: a.update(q=torch.cat([a["q"], a["q"]])), ValueError, "batch"),
    (lambda a: a.update(q=a["q"][..., :32]), ValueError, "head dim"),
    (lambda a: a.update(q=a["q"].transpose(2, 3).contiguous().transpose(2, 3)), ValueError,
     "contiguous last dim"),
    (lambda a: a.update(num_splits=-1), TypeError, "num_splits"),
    (lambda a: a.update(q="q"), TypeError, "q must be a torch.Tensor"),
])
def test_bad_inputs_raise(change, exc, match):
    args = _good()
    change(args)
    q = args.pop("q")
    k_cache, v_cache = args.pop("k_cache"), args.pop("v_cache")
    seqlens, table = args.pop("cache_seqlens"), args.pop("block_table")
    with pytest.raises(exc, match=match):
        paged_attention(q, k_cache, v_cache, seqlens, table, **args)


@pytest.mark.skipif(not CUDA, reason="needs a second device type (CUDA) for the mismatch")
def test_device_mismatch_raises():
    a = _good()
    with pytest.raises(ValueError, match="block_table is on"):
        paged_attention(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"],
                        a["block_table"].cpu())


def test_block_table_too_short_in_validation_mode():
    a = _good()
    short = a["block_table"][:, :1].contiguous()  # sequence 0 has 20 keys: needs 2 pages
    with pytest.raises(ValueError, match="block_table is too short for sequence 0"):
        paged_attention(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], short,
                        check_block_table=True)
    bad = a["block_table"].clone()
    bad[1, 0] = a["k_cache"].shape[0]
    with pytest.raises(ValueError, match="names a page outside"):
        paged_attention(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], bad,
                        check_block_table=True)
    k = torch.zeros((2, 40, 2, 64), dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="too short"):
        append_paged_kv(k, k, a["k_cache"], a["v_cache"], a["cache_seqlens"], short,
                        check_block_table=True)


def test_merge_bad_inputs_raise():
    o = torch.zeros((2, 3, 64), device=DEVICE)
    lse = torch.zeros((2, 3), device=DEVICE)
    with pytest.raises(ValueError, match="lse_b must have shape"):
        merge_attention_states(o, lse, o, lse[:, :2])
    with pytest.raises(TypeError, match="lse_a must be one of"):
        merge_attention_states(o, lse.half(), o, lse)
    with pytest.raises(TypeError, match="o_b has dtype"):
        merge_attention_states(o, lse, o.half(), lse)


@pytest.mark.parametrize("kwargs,name", [
    (dict(rotary_cos=1), "rotary_cos"), (dict(cache_batch_idx=1), "cache_batch_idx"),
    (dict(window_size=(8, 0)), "window_size"), (dict(softcap=30.0), "softcap"),
    (dict(alibi_slopes=1), "alibi_slopes"), (dict(cache_leftpad=1), "cache_leftpad"),
    (dict(block_table=None), "block_table"),
])
def test_flash_attn_wrapper_unsupported(kwargs, name):
    a = _good()
    args = dict(cache_seqlens=a["cache_seqlens"], block_table=a["block_table"])
    args.update(kwargs)
    with pytest.raises(NotImplementedError, match=name):
        flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], **args)


def test_flash_attn_wrapper_defaults_match():
    a = _good()
    with poison_empty:
        out = flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], cache_seqlens=20,
                                      block_table=a["block_table"])
        ref = paged_attention(a["q"], a["k_cache"], a["v_cache"],
                              torch.full_like(a["cache_seqlens"], 20), a["block_table"],
                              causal=False)
    assert torch.equal(out, ref)


def test_num_splits_auto_reads_shapes_only():
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    cfg = _PAGED_DECODE_TABLE[(9, 0)][128]  # the Hopper row, also under the interpreter
    s = decode.choose_num_splits(1, 8, 131072, 132, cfg)
    assert 1 < s <= MAX_SPLITS
    assert decode.choose_num_splits(256, 12, 256, 132, cfg) == 1
    assert decode.choose_num_splits(1, 1, 16, 132, cfg) == 1
    assert decode.choose_num_splits(32, 8, 2048, 132, cfg) == 1   # 256 programs: no split
    assert decode.choose_num_splits(16, 12, 4096, 132, cfg) > 1   # 192 programs: split
    # 768 programs (5.8 an SM): one pass, its page ids carried (two waves of three an SM,
    # test_plain_launch_shape_follows_the_launch); 840 (6.4): the slow band's 3 splits
    assert decode.choose_num_splits(64, 12, 1024, 132, cfg) == 1
    assert decode.choose_num_splits(64, 12, 8192, 132, cfg) == 1
    assert decode.choose_num_splits(96, 8, 4096, 132, cfg) == 1
    assert decode.choose_num_splits(70, 12, 2048, 132, cfg) == 3
    assert decode.choose_num_splits(48, 12, 2048, 132, cfg) == 1  # 576 (4.4): one wave of five


def test_plain_launch_shape_follows_the_launch():
    """The plain d128 row's tile and page-id choices for the launch the auto count made
    (``decode._launch_shape_config``; H100 measurements, 2026-11-27, twelfth session, and H200,
    2026-11-29, docs/notes.md): one pass in the one-pass band carries its page ids (and under MHA
    takes int64 offsets); launches whose waves of three programs an SM fill (one wave, or a last
    one at least 80% full in a single pass) with splits of 512 keys or more take 128-key tiles, and the split
    count then drops the splits the longer tile leaves empty; the rest keep the row (64-key
    tiles, int32 offsets)."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    row = _PAGED_DECODE_TABLE[(9, 0)][128]

    def shape(batch, heads_k, keys, mha=False):
        splits = decode.choose_num_splits(batch, heads_k, keys, 132, row)
        c = decode._launch_shape_config(row, batch * heads_k, splits, keys, 132, mha=mha)
        assert c.int64_kv_offsets == (mha and c.prefetch_pages)
        return splits, c.block_n, c.prefetch_pages, c.num_warps, c.num_stages

    assert shape(64, 12, 1024) == (1, 128, True, 4, 2)    # 768 programs: two waves of three
    assert shape(64, 12, 1024, mha=True) == (1, 128, True, 4, 2)  # int64 offsets there
    assert shape(16, 12, 4096, mha=True) == (2, 128, False, 4, 2)  # 384: one wave
    assert shape(88, 8, 2048) == (1, 128, True, 4, 2)     # 704: 1.78 waves
    assert shape(70, 12, 2048) == (3, 64, False, 4, 2)    # the slow band's 3 x 840 keep 64
    assert shape(48, 12, 2048) == (1, 64, False, 4, 2)    # 576: 1.45 waves of three an SM
    assert shape(72, 8, 2048) == (1, 64, False, 4, 2)     # 576
    assert shape(80, 8, 2048) == (1, 128, False, 4, 2)    # 640: 1.62 waves
    assert shape(128, 8, 512) == (1, 128, False, 4, 2)    # 1024: 2.59 waves
    assert shape(256, 2, 512) == (1, 64, False, 4, 2)     # 512: 1.29 waves
    assert shape(64, 8, 1024) == (1, 64, False, 4, 2)     # 512
    assert shape(128, 2, 512) == (1, 128, False, 4, 2)    # 256 programs of 512 keys
    assert shape(64, 2, 1024) == (2, 128, False, 4, 2)    # 2 x 128
    assert shape(1, 2, 65536) == (128, 128, False, 4, 2)  # 128 x 2
    assert shape(128, 1, 512) == (1, 128, False, 4, 2)    # GQA 8/1
    assert shape(128, 2, 256) == (1, 64, False, 4, 2)     # 256-key splits keep 64
    assert shape(1, 2, 131072) == (187, 128, False, 4, 2)  # 374 programs (2.8 an SM)
    assert decode.busy_splits(131072, 187, 128) == 171    # what the plan then launches


@pytest.mark.parametrize("heads, batch, keys, q_len, want", [
    ((12, 2), 48, 4096, 1, (128, 4, 4)),    # GROUP 6 merged in the launch: 4 at once
    ((12, 2), 96, 2048, 1, (128, 2, 4)),
    ((12, 2), 56, 1024, 1, (128, 2, 2)),    # 224 programs: two an SM fit them in one wave
    ((12, 2), 64, 1024, 1, (128, 1, 2)),    # 128 fill the SMs: the one-wave launch
    ((24, 8), 16, 4096, 1, (128, 3, 4)),    # GROUP 3
    ((32, 8), 16, 4096, 1, (128, 3, 2)),    # GROUP 4 keeps the row's 2 (177 registers at 4)
    ((12, 2), 48, 4096, 2, (128, 4, 2)),    # two tokens: not the compiled launch
    ((12, 2), 1, 131072, 1, (128, 171, 2)),  # the combine kernel's launch
])
def test_wide_merge_partials_at_once_follow_the_group(monkeypatch, heads, batch, keys, q_len,
                                                      want):
    """The plan's ``merge_splits_at_once`` for the Hopper d128 row's 128-key launches that merge
    in the launch: the row's ``wide_merge_at_once`` by q heads a KV head, one new token only
    (tests/test_decode_pipelining.py has the register counts it keeps at three programs an
    SM)."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    row = _PAGED_DECODE_TABLE[(9, 0)][128]
    monkeypatch.setattr(decode, "device_info", lambda device: ((9, 0), 132))
    monkeypatch.setattr(decode, "_default_config", lambda *a: row)
    meta = dict(device="meta")  # shapes only: nothing launches, on any machine
    pages = keys // 16
    q = torch.empty(batch, q_len, heads[0], 128, dtype=torch.float16, **meta)
    k = torch.empty(batch * pages + 1, 16, heads[1], 128, dtype=torch.float16, **meta)
    table = torch.empty(batch, pages, dtype=torch.int32, **meta)
    plan = decode.PagedDecodePlan(q, k, k, torch.empty(batch, dtype=torch.int32, **meta), table)
    assert (plan.config.block_n, plan.num_splits, plan.config.merge_splits_at_once) == want


def test_wide_tiles_drop_empty_splits(monkeypatch):
    """A plan whose launch takes the row's longer tile launches only splits that hold keys at
    that tile (the auto count was cut for the row's own)."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    row = _PAGED_DECODE_TABLE[(9, 0)][128]
    monkeypatch.setattr(decode, "device_info", lambda device: ((9, 0), 132))
    monkeypatch.setattr(decode, "_default_config", lambda *a: row)
    meta = dict(device="meta")  # shapes only: nothing launches, on any machine
    q = torch.empty(1, 1, 12, 128, dtype=torch.float16, **meta)
    k = torch.empty(8193, 16, 2, 128, dtype=torch.float16, **meta)
    table = torch.empty(1, 8192, dtype=torch.int32, **meta)
    plan = decode.PagedDecodePlan(q, k, k, torch.empty(1, dtype=torch.int32, **meta), table)
    assert (plan.config.block_n, plan.num_splits) == (128, 171)


def test_a_forced_split_count_takes_the_rule_s_launch_at_that_count(monkeypatch):
    """A split count the caller forces launches what the rule would at that count (its tile,
    stages and merge), not the row's bare config: forced 2 splits at GQA 12/2 64 x 1024 ran the
    64-key tile 12% slower than the rule's 128-key one (H200). The count stays as forced, and a
    config the caller passes stays as given."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    row = _PAGED_DECODE_TABLE[(9, 0)][128]
    monkeypatch.setattr(decode, "device_info", lambda device: ((9, 0), 132))
    monkeypatch.setattr(decode, "_default_config", lambda *a: row)
    meta = dict(device="meta")  # shapes only: nothing launches, on any machine
    q = torch.empty(64, 1, 12, 128, dtype=torch.float16, **meta)
    k = torch.empty(64 * 64 + 1, 16, 2, 128, dtype=torch.float16, **meta)
    table = torch.empty(64, 64, dtype=torch.int32, **meta)
    args = (q, k, k, torch.empty(64, dtype=torch.int32, **meta), table)
    # the rule's own launch: one wave of one program an SM (128 programs of 1024 keys)
    auto = decode.PagedDecodePlan(*args)
    assert (auto.config.block_n, auto.config.num_stages, auto.config.prefetch_pages,
            auto.num_splits, auto.batch_cut) == (*row.one_wave, True, 1, 0)
    assert decode.PagedDecodePlan(*args, num_splits=1).config == auto.config
    # 2 splits: 256 programs, past one an SM: the wide tile at the row's stages
    two = decode.PagedDecodePlan(*args, num_splits=2)
    assert (two.config.block_n, two.config.num_stages, two.num_splits) == (
        row.wide_block_n, row.num_stages, 2)
    # 3 splits of 342 keys: under the wide tile's floor (512), the row's tile; the count kept
    three = decode.PagedDecodePlan(*args, num_splits=3)
    assert (three.config.block_n, three.num_splits) == (row.block_n, 3)
    given = decode.PagedDecodePlan(*args, num_splits=2, config=row)
    assert given.config == row and row.block_n != 128


@pytest.mark.parametrize("batch,heads_k,keys,splits", [
    (64, 2, 1024, 1),    # GQA 12/2 64 x 1024: 128 programs
    (32, 2, 1024, 2),    # 64 programs a split: two fill the SMs
    (16, 2, 4096, 4),    # 32: four of 1024 keys
    (66, 2, 512, 1),     # 132: every SM
    (48, 2, 1024, 0),    # 96 programs: 0.73 of the SMs, under ONE_WAVE_FILL
    (8, 2, 8192, 0),     # 16: four splits (the merged most) fill 64 SMs
    (80, 2, 1024, 0),    # 160 programs: past one an SM
    (64, 2, 4096, 0),    # one pass of 4096 keys: longer than measured
    (64, 2, 256, 0),     # 256 keys: shorter than measured
    (11, 12, 2048, 1),   # MHA 12/12 11 x 2048: 132 programs
])
def test_one_wave_split_count(batch, heads_k, keys, splits):
    """``one_wave_splits``: the launch that fills one wave of one program an SM, at the shapes
    measured (or the 0 that leaves the split rule to ``choose_num_splits``)."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    from kvonce.paged.splits import is_one_wave, one_wave_splits
    row = _PAGED_DECODE_TABLE[(9, 0)][128]
    got = one_wave_splits(batch * heads_k, keys, 132, row)
    assert got == splits
    if got:
        assert is_one_wave(batch * heads_k, got, keys, 132, row)
        assert batch * heads_k * got <= 132 and got <= row.max_merged_splits
    bare = dataclasses.replace(row, one_wave=())
    assert one_wave_splits(batch * heads_k, keys, 132, bare) == 0


def test_one_wave_needs_one_m_block(monkeypatch):
    """Two new tokens a sequence (two M-blocks' worth of programs at GROUP 12 x 2 > 16 rows,
    or q_len > 1 at all) never take the one-wave launch: it counts programs at one M-block."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    row = _PAGED_DECODE_TABLE[(9, 0)][128]
    monkeypatch.setattr(decode, "device_info", lambda device: ((9, 0), 132))
    monkeypatch.setattr(decode, "_default_config", lambda *a: row)
    meta = dict(device="meta")
    for q_len in (1, 2):
        q = torch.empty(64, q_len, 12, 128, dtype=torch.float16, **meta)
        k = torch.empty(64 * 64 + 1, 16, 2, 128, dtype=torch.float16, **meta)
        plan = decode.PagedDecodePlan(q, k, k, torch.empty(64, dtype=torch.int32, **meta),
                                      torch.empty(64, 64, dtype=torch.int32, **meta))
        assert (plan.config.num_stages == row.one_wave[1]) == (q_len == 1)


def test_busy_splits_leave_no_split_empty():
    """``busy_splits``: the count of tile-aligned ranges (as the kernel cuts them) that hold keys;
    no range of the returned count is empty, at this tile or any smaller one."""
    from kvonce.paged.splits import busy_splits
    assert busy_splits(131072, 66, 128) == 64   # 2048-key ranges
    assert busy_splits(131072, 49, 128) == 49   # 2688-key ranges, the last one shorter
    assert busy_splits(131072, 1, 128) == 1 and busy_splits(0, 8, 128) == 8
    for keys in (1, 100, 777, 4096, 5000, 131072):
        for splits in range(1, 80):
            for block_n in (16, 64, 128):
                busy = busy_splits(keys, splits, block_n)
                assert 1 <= busy <= splits
                for bn in (block_n, block_n // 2):
                    split_len = -(-(-(-keys // busy)) // bn) * bn
                    assert (busy - 1) * split_len < keys  # the last range holds a key


def test_num_splits_quantized_rows():
    """The quantized Hopper rows' split counts at the swept shapes (docs/notes.md, 2026-11-26
    and -27): fp8 and int8 aim at 3 programs per SM (their kernels hold 168 registers: three
    fit) and keep 2048 keys a split; fp8 and int8 (channel pairs) and int4 split from 3.5
    programs per SM, except from 5 to 6 (2026-11-27, sixth session)."""
    from kvonce.kernels.configs import _PAGED_DECODE_QUANT_TABLE
    fp8 = _PAGED_DECODE_QUANT_TABLE[((9, 0), "fp8_e4m3")][128]
    assert decode.choose_num_splits(1, 8, 131072, 132, fp8) == 49   # 392 programs
    # 396 programs asked (33 splits), but 33 ranges of whole 128-key tiles are 4096 keys each:
    # 32 hold the keys, the 33rd would launch empty
    assert decode.choose_num_splits(1, 12, 131072, 132, fp8) == 32
    assert decode.choose_num_splits(16, 12, 4096, 132, fp8) == 2    # 192 -> 384, not 1
    assert decode.choose_num_splits(16, 8, 4096, 132, fp8) == 2     # 2048 keys a split
    assert decode.choose_num_splits(64, 8, 8192, 132, fp8) == 2     # 512 programs: slow band
    int4 = _PAGED_DECODE_QUANT_TABLE[((9, 0), "int4")][128]
    assert decode.choose_num_splits(64, 8, 8192, 132, int4) == 2    # 512 programs: the slow band
    int8 = _PAGED_DECODE_QUANT_TABLE[((9, 0), "int8")][128]
    assert decode.choose_num_splits(16, 8, 4096, 132, int8) == 2    # 2048 keys a split
    assert decode.choose_num_splits(1, 8, 131072, 132, int8) == 49
    assert decode.choose_num_splits(64, 8, 8192, 132, int8) == 2    # 512 programs: slow band
    for row in (fp8, int8, int4):
        # 768 programs (5.8 an SM) fill two waves of three: one pass (its one-pass band); 840
        # (6.4 an SM) leave a thin third wave: two splits; 480 (3.6): two
        assert decode.choose_num_splits(64, 12, 8192, 132, row) == 1
        assert decode.choose_num_splits(56, 12, 4096, 132, row) == 1
        assert decode.choose_num_splits(70, 12, 4096, 132, row) == 2
        assert decode.choose_num_splits(40, 12, 4096, 132, row) == 2
        assert row.max_merged_splits == 4  # the combine kernel from 5 splits (int4 since 11-27)


def test_num_splits_long_floor_never_starves_the_launch():
    """fp8 and int8 keep 2048 keys a split only while that leaves the launch at least half its
    program target (396 on 132 SMs); with few KV heads they fall back to 512-key splits (the
    counts that measured best at each shape, H100, 2026-11-27: docs/notes.md)."""
    from kvonce.kernels.configs import _PAGED_DECODE_QUANT_TABLE
    from kvonce.paged.splits import FALLBACK_MIN_KEYS
    for fmt in ("fp8_e4m3", "int8"):
        row = _PAGED_DECODE_QUANT_TABLE[((9, 0), fmt)][128]
        assert row.min_keys_per_split > FALLBACK_MIN_KEYS
        # (batch, KV heads, keys) -> splits; the old count and its programs in the comment
        cases = {(8, 2, 8192): 16,       # was 4: 64 programs
                 (2, 2, 32768): 64,      # was 16: 64
                 (1, 2, 65536): 128,     # was 32: 64
                 (1, 2, 131072): 171,    # was 64: 128 (198 asked, 171 ranges hold keys)
                 (32, 2, 2048): 4,       # was 1: 64
                 (16, 2, 4096): 8,       # was 2: 64
                 (64, 2, 2048): 3,       # was 1: 128
                 (1, 8, 32768): 43,      # was 16: 128
                 (1, 12, 32768): 32,     # was 16: 192
                 # the floor holds from 256 programs
                 (16, 8, 4096): 2, (16, 12, 4096): 2, (8, 12, 8192): 4, (4, 8, 16384): 8,
                 (1, 8, 65536): 32, (1, 8, 131072): 49}
        for (batch, heads_k, keys), want in cases.items():
            got = decode.choose_num_splits(batch, heads_k, keys, 132, row)
            assert got == want, (fmt, batch, heads_k, keys, got, want)
            # whole-tile ranges: none of the splits is empty, none shorter than 512 keys
            split_len = -(-(-(-keys // got)) // row.block_n) * row.block_n
            assert (got - 1) * split_len < keys
            assert got == 1 or keys // got >= FALLBACK_MIN_KEYS - row.block_n


def test_bf16_queries_take_the_bf16_row(monkeypatch):
    from kvonce.kernels import configs
    monkeypatch.setattr(configs, "interpreter_active", lambda: False)  # the Hopper rows, on a CPU
    table, get = configs._PAGED_DECODE_QUANT_TABLE, configs.get_paged_decode_config
    assert get((9, 0), 128, "int4", bf16=True) is table[((9, 0), "int4/bf16")][128]
    assert get((9, 0), 128, "int4") is table[((9, 0), "int4")][128]
    assert get((9, 0), 128, "int8", bf16=True) is table[((9, 0), "int8")][128]
    assert get((9, 0), 64, "int4", bf16=True) is get((9, 0), 64)  # no row: the plain one


def test_token_major_int4_pages_take_head_pairs_where_they_can_run(monkeypatch):
    """The plan's default config (``paged.decode._default_config``) on a 132-SM Hopper: int4
    pages stored token-major take the head-pair row when the pairs can run (even KV head count,
    head dim 128, fp16/bf16 q) and their launch fills its waves (``PAIR_WAVE_FILL``), else the
    format's row; head-major pages, other formats and fp32 q never take it. (The rows compare
    with ``gluon`` off: where int4 takes the Gluon decode is test_gluon_decode.py's.)"""
    from kvonce.kernels import configs
    from kvonce.paged.decode import PAIR_WAVE_FILL, _default_config
    monkeypatch.setattr(configs, "interpreter_active", lambda: False)  # the Hopper rows, on a CPU
    table = configs._PAGED_DECODE_QUANT_TABLE
    def rows(config):
        return dataclasses.replace(config, gluon=False)

    pairs = rows(table[((9, 0), "int4/token-major")][128])
    int4 = rows(table[((9, 0), "int4")][128])
    assert pairs.head_pairs and not int4.head_pairs and pairs.programs_per_sm == 2

    def pick(batch, keys, heads, heads_k, dtype=torch.float16, head_major=False, fmt="int4",
             head_dim=128):
        q = torch.empty(batch, 1, heads, head_dim, dtype=dtype)
        stored = head_dim // 2 if fmt == "int4" else head_dim
        k = torch.empty(5, 16, heads_k, stored, dtype=torch.uint8)
        if head_major:
            k = k.transpose(1, 2).contiguous().transpose(1, 2)
        table_ = torch.empty(batch, keys // 16, dtype=torch.int32)
        return rows(_default_config((9, 0), 132, q, k, table_, fmt, {"int4": 3, "int8": 2}[fmt]))

    # GQA 32/8 64 x 8192: 256 pair programs (0.97 of a wave); 1 x 131072: 66 splits, one wave;
    # MHA 64 x 8192: 384 pairs = 2.9 programs an SM, two splits (the slow band from 2.3): 2.91
    # waves of 3
    assert pick(64, 8192, 32, 8) == pairs and pick(64, 8192, 32, 8, torch.bfloat16) == pairs
    assert pick(1, 131072, 32, 8) == pairs and pick(1, 131072, 12, 12) == pairs
    assert decode.choose_num_splits(64, 6, 8192, 132, pairs) == 2
    assert pick(64, 8192, 12, 12) == pairs
    # MHA 32 x 8192 and 16 x 4096: 192 pair programs, 0.73 of a wave: one head a program
    assert 192 / 264 < PAIR_WAVE_FILL
    assert pick(32, 8192, 12, 12) == int4 and pick(16, 4096, 12, 12) == int4
    assert pick(0, 8192, 32, 8) == int4  # an empty batch: one program, a sliver of a wave
    assert pick(64, 8192, 32, 8, head_major=True) == int4
    assert pick(64, 8192, 24, 3) == int4  # odd KV head counts: one head a program
    assert pick(64, 8192, 32, 8, head_dim=64) == rows(
        configs.get_paged_decode_config((9, 0), 64, "int4"))
    assert pick(64, 8192, 32, 8, torch.float32) == rows(configs._PAGED_DECODE_FALLBACK)
    assert pick(64, 8192, 32, 8, fmt="int8") == rows(table[((9, 0), "int8")][128])


@pytest.mark.parametrize("fmt", ["plain", "int4"])
@pytest.mark.parametrize("num_splits", [3, 5, 7])
def test_in_launch_merge_loads_splits_ahead_with_the_same_bytes(fmt, num_splits):
    """``merge_splits_at_once`` 2 and 4: the last split to finish loads that many partials
    before folding them, in the same order, so out and LSE are the bytes of the one-at-a-time
    merge (split counts off the chunk: the padding splits load nothing and weigh zero); all
    match the reference. Sequences of 0, 37 and 700 keys (empty splits included)."""
    import dataclasses

    from kvonce import dequantize_kv
    torch.manual_seed(0)
    lens = [0, 37, 700]
    pages = 44 * len(lens)
    q = torch.randn(len(lens), 1, 8, 128, dtype=torch.float16, device=DEVICE)
    k = torch.randn(pages, 16, 2, 128, dtype=torch.float16, device=DEVICE)
    v = torch.randn_like(k)
    table = torch.randperm(pages, device=DEVICE).reshape(len(lens), -1).to(torch.int32)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cap = torch.cuda.get_device_capability() if DEVICE == "cuda" else None
    if fmt == "int4":
        k, ks = quantize_kv(k, "int4")
        v, vs = quantize_kv(v, "int4")
        kw = dict(k_scale=ks, v_scale=vs, kv_format="int4")
        kd, vd = (dequantize_kv(t, sc, "int4", torch.float32) for t, sc in ((k, ks), (v, vs)))
        base = decode.get_paged_decode_config(cap, 128, "int4")
    else:
        kw, kd, vd = {}, k.float(), v.float()
        base = decode.get_paged_decode_config(cap, 128)
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    runs = []
    for at_once in (1, 2, 4):
        config = dataclasses.replace(base, max_merged_splits=8, merge_splits_at_once=at_once)
        plan = decode.PagedDecodePlan(q, k, v, seqlens, table, num_splits=num_splits,
                                      config=config, **kw)
        run_kw = {key: val for key, val in kw.items() if key != "kv_format"}
        with poison_empty:
            runs.append(plan.run(q, k, v, seqlens, table, return_lse=True, **run_kw))
        assert [la._constexprs["MERGE_HERE"] for la in plan._launches.values()] == [True]
    out, lse = runs[0]
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 2e-2, rel
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max() < 1e-2
    for other, other_lse in runs[1:]:
        assert other.equal(out) and other_lse.equal(lse)


def test_short_split_tile_follows_the_split_length(monkeypatch):
    """``short_split_block_n``: 64-key tiles where the splits are shorter than 4096 keys."""
    import dataclasses
    from kvonce.kernels import configs
    cfg = dataclasses.replace(configs._INT4, short_split_block_n=64)
    q = torch.randn(1, 1, 8, 64, dtype=torch.float16, device=DEVICE)
    k, scale = quantize_kv(torch.randn(2, 16, 4, 64, dtype=torch.float16, device=DEVICE), "int4")
    for pages, splits, block_n in ((512, 2, 128), (512, 3, 64), (512, 1, 128)):
        table = torch.zeros(1, pages, dtype=torch.int32, device=DEVICE)
        plan = decode.PagedDecodePlan(q, k, k, torch.tensor([20], dtype=torch.int32,
                                                            device=DEVICE), table, config=cfg,
                                      num_splits=splits, kv_format="int4", k_scale=scale,
                                      v_scale=scale)
        assert plan.config.block_n == block_n, (pages * 16 // splits, plan.config.block_n)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_register_cap_reaches_the_launch(num_splits, monkeypatch):
    """``PagedDecodeConfig.max_registers`` reaches the compiled launch, by the plan's own launch
    and through the custom op (the path torch.compile and dispatch modes take), with the same
    output."""
    import dataclasses
    a = _good()
    args = (a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["block_table"])
    cfg = dataclasses.replace(decode.get_paged_decode_config(None, 64), max_registers=168)
    plan = decode.PagedDecodePlan(*args, config=cfg, num_splits=num_splits)
    out = plan.run(*args)
    assert [launch._maxnreg for launch in plan._launches.values()] == [168]
    caps = []

    class Recording(decode.PagedDecodeLaunch):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            caps.append(self._maxnreg)

    monkeypatch.setattr(decode, "PagedDecodeLaunch", Recording)
    op_out = plan._run_op(*args)[0]
    assert caps == [168]
    assert torch.equal(out, op_out)
    torch.testing.assert_close(out.float(), paged_attention_ref(*args)[0].float(), atol=2e-3,
                               rtol=0)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_masked_loop_stages_reach_the_launch_with_the_same_bytes(num_splits, monkeypatch):
    """``paged_decode.MASKED_LOOP_STAGES`` (the masked band's own pipeline depth, off by
    default) reaches the launch, on the plan's path and the custom op's, and changes no byte of
    the output: lengths off the tile grid, so every sequence's last split runs the masked
    loop."""
    from kvonce.kernels import paged_decode as pd
    a = _good()
    args = (a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["block_table"])
    outs = []
    for stages in (0, 1):
        monkeypatch.setattr(pd, "MASKED_LOOP_STAGES", stages)
        plan = decode.PagedDecodePlan(*args, num_splits=num_splits)
        with poison_empty:
            outs.append(plan.run(*args))
        assert [la._constexprs["MASKED_STAGES"] for la in plan._launches.values()] == [stages]
        assert torch.equal(plan._run_op(*args)[0], outs[-1])
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[1].float(), paged_attention_ref(*args)[0].float(),
                               atol=2e-3, rtol=0)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_op_path_launches_the_plan_s_kernel(num_splits, monkeypatch):
    """The custom op (torch.compile's and the dispatch modes' path) rebuilds the plan's launch
    from the config's fields one by one: the same constexprs, warps, stages and register cap as
    the plan's own launch, and the same bytes out. A field the op dropped ran another kernel:
    ``merge_splits_at_once`` until 2026-11-30 (one partial at a time: 176 registers against
    168 on sm_90a, two programs an SM instead of three)."""
    import dataclasses
    a = _good()
    args = (a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["block_table"])
    cfg = dataclasses.replace(decode.get_paged_decode_config(None, 64), max_merged_splits=4,
                              merge_splits_at_once=2, max_registers=168)
    plan = decode.PagedDecodePlan(*args, config=cfg, num_splits=num_splits)
    out = plan.run(*args)
    (eager,) = plan._launches.values()
    assert eager._constexprs["MERGE_SPLITS_AT_ONCE"] == 2
    built = []

    class Recording(decode.PagedDecodeLaunch):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            built.append(self)

    monkeypatch.setattr(decode, "PagedDecodeLaunch", Recording)
    op_out = plan._run_op(*args)[0]
    assert len(built) == 1
    # the op returns the LSE too (STORE_LSE), a store after the kernel's loops
    op_constexprs = dict(built[0]._constexprs, STORE_LSE=eager._constexprs["STORE_LSE"])
    assert op_constexprs == eager._constexprs
    assert (built[0]._warps, built[0]._maxnreg) == (eager._warps, eager._maxnreg)
    assert torch.equal(out, op_out)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_plain_int32_and_int64_offsets_agree(num_splits):
    """A plain cache addresses K/V in int64 where its config sets ``int64_kv_offsets`` (the GPU
    rows but d128's, MHA's one pass there) and in int32 where it does not and every offset
    fits: the same bytes out, by the plan's launch and through the custom op, and the
    reference's output."""
    import dataclasses
    a = _good()
    args = (a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["block_table"])
    base = decode.get_paged_decode_config(None, 64)
    outs = []
    for wide in (False, True):
        plan = decode.PagedDecodePlan(*args, num_splits=num_splits,
                                      config=dataclasses.replace(base, int64_kv_offsets=wide))
        with poison_empty:
            outs.append(plan.run(*args))
        assert [la._constexprs["INT64_KV"] for la in plan._launches.values()] == [wide]
        assert torch.equal(plan._run_op(*args)[0], outs[-1])
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0].float(), paged_attention_ref(*args)[0].float(), atol=2e-3,
                               rtol=0)


def test_plan_mha_stage_count():
    """A row with ``mha_num_stages`` (int4's had 3 over 2 until its own count became 3) runs
    that many stages where each KV head serves one q head, its ``num_stages`` under GQA."""
    import dataclasses

    from kvonce.kernels.configs import _PAGED_DECODE_QUANT_TABLE
    cfg = dataclasses.replace(_PAGED_DECODE_QUANT_TABLE[((9, 0), "int4")][128], num_stages=2,
                              mha_num_stages=3)
    for nheads, stages in ((4, 3), (8, 2)):
        q = torch.randn(1, 1, nheads, 64, dtype=torch.float16, device=DEVICE)
        k, scale = quantize_kv(torch.randn(2, 16, 4, 64, dtype=torch.float16, device=DEVICE),
                               "int4")
        ints = dict(dtype=torch.int32, device=DEVICE)
        plan = decode.PagedDecodePlan(q, k, k, torch.tensor([20], **ints),
                                      torch.tensor([[0, 1]], **ints), config=cfg,
                                      kv_format="int4", k_scale=scale, v_scale=scale)
        assert plan.config.num_stages == stages


# ------------------------------------------------------------------------------------------------
# GPU: bf16, real sizes, CUDA graphs
# ------------------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("nheads,nheads_k,head_dim,page_size", [
    (32, 8, 128, 16), (12, 2, 128, 16), (12, 12, 128, 64), (32, 1, 64, 256), (16, 4, 256, 32),
    (24, 4, 96, 128),
])
def test_gpu_real_sizes(dtype, nheads, nheads_k, head_dim, page_size):
    lens = [1, 4096, 3001, page_size, 777, 12000]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=page_size, nheads_k=nheads_k,
                                                  head_dim=head_dim, dtype=dtype)
    for q_len in (1, 4):
        q = make_q(len(lens), q_len, nheads, head_dim, dtype)
        ref_o, ref_lse = paged_attention_ref(q, k_cache, v_cache, seqlens, table)
        sdpa_o = paged_attention_sdpa_ref(q, k_cache, v_cache, seqlens, table)
        for num_splits in (0, 1, 7):
            with poison_empty:
                out, lse = paged_attention(q, k_cache, v_cache, seqlens, table,
                                           num_splits=num_splits, return_lse=True)
            assert rel_err(out, ref_o) < TOL[dtype], f"q_len={q_len} num_splits={num_splits}"
            assert rel_err(out, sdpa_o) < TOL[dtype]
            assert lse_err(lse, ref_lse) < 2e-2


@gpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,nheads,nheads_k,max_len", [
    (64, 12, 2, 1024), (32, 12, 2, 1024), (16, 12, 2, 4096), (16, 32, 8, 2048),
])
def test_gpu_one_wave_launch(dtype, batch, nheads, nheads_k, max_len):
    """The one-wave launch (``PagedDecodeConfig.one_wave``: 128-key tiles at 3 stages with
    carried page ids, one program an SM, 1-4 splits merged in the launch) against the
    references, ragged lengths (a sequence of one key, one page, one off the tile grid), and
    replayed in a CUDA graph."""
    from kvonce.paged.splits import is_one_wave
    g = torch.Generator().manual_seed(batch)
    lens = torch.randint(1, max_len + 1, (batch,), generator=g)
    lens[0], lens[1], lens[2], lens[3] = max_len, 1, 16, max_len - 77
    k_cache, v_cache, seqlens, table = make_paged(lens.tolist(), page_size=16,
                                                  nheads_k=nheads_k, head_dim=128, dtype=dtype,
                                                  spare_pages=0)
    q = make_q(batch, 1, nheads, 128, dtype)
    plan = decode.PagedDecodePlan(q, k_cache, v_cache, seqlens, table)
    capability, num_sms = decode.device_info(q.device)
    if capability == (9, 0) and plan.config.one_wave:
        # the launch under test is the one that ran
        assert is_one_wave(batch * nheads_k, plan.num_splits, max_len, num_sms, plan.config)
        assert (plan.config.block_n, plan.config.num_stages) == plan.config.one_wave
        assert plan.config.prefetch_pages
    ref_o, _ = paged_attention_ref(q, k_cache, v_cache, seqlens, table)
    with poison_empty:
        out = plan.run(q, k_cache, v_cache, seqlens, table)
    assert rel_err(out, ref_o) < TOL[dtype]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = plan.run(q, k_cache, v_cache, seqlens, table)
    for _ in range(2):   # the in-launch merge's arrival counts are back at zero after a replay
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, out)


@gpu_only
def test_cuda_graph_capture_replay_equals_eager():
    dtype = torch.bfloat16
    lens = [100, 5000, 64, 2048]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=8, head_dim=128,
                                                  dtype=dtype)
    q = make_q(4, 1, 32, 128, dtype)
    g = torch.Generator().manual_seed(11)
    k_new = torch.randn((4, 1, 8, 128), generator=g).to(dtype).cuda()
    v_new = torch.randn((4, 1, 8, 128), generator=g).to(dtype).cuda()
    kc_eager, vc_eager = k_cache.clone(), v_cache.clone()
    with poison_empty:
        eager = flash_attn_with_kvcache(q, kc_eager, vc_eager, k=k_new, v=v_new,
                                        cache_seqlens=seqlens, block_table=table, causal=True)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compiles) outside the capture
        flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k=k_new, v=v_new,
                                cache_seqlens=seqlens, block_table=table, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), poison_empty:  # the NaN fill is captured too
        captured = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                           cache_seqlens=seqlens, block_table=table, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert torch.equal(k_cache, kc_eager)
    # New values in the same buffers: the replay follows them (lengths read on the device).
    seqlens.copy_(torch.tensor([3000, 17, 64, 1], dtype=torch.int32))
    q.normal_()
    graph.replay()
    torch.cuda.synchronize()
    with poison_empty:
        again = paged_attention(q, k_cache, v_cache, seqlens + 1, table, causal=True)
    assert torch.equal(captured, again)


def test_plan_run_reused_across_values():
    dtype = torch.float16
    k_cache, v_cache, seqlens, table = make_paged([40, 7], page_size=16, nheads_k=2, head_dim=64,
                                                  dtype=dtype)
    q = make_q(2, 1, 4, 64, dtype)
    with poison_empty:
        plan = decode.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=3)
    for lens in ([40, 7], [1, 48], [33, 16]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        q2 = make_q(2, 1, 4, 64, dtype, seed=sum(lens))
        ref_o, _ = paged_attention_ref(q2, k_cache, v_cache, seqlens, table)
        with poison_empty:
            out = plan.run(q2, k_cache, v_cache, seqlens, table)
        assert rel_err(out, ref_o) < TOL[dtype]
    with pytest.raises(ValueError, match="differ from the plan"):
        plan.run(make_q(2, 2, 4, 64, dtype), k_cache, v_cache, seqlens, table)
