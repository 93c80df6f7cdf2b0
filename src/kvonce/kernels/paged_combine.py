"""Merging attention partials: the split-K combine of the paged decode (in the decode launch,
``_combine_splits``, or as its own kernel, ``_combine_splits_kernel``) and
``merge_attention_states``' two-input merge. Partials are normalized outputs with their LSE
(natural log); a ``-inf`` LSE weighs exactly zero whatever its output holds. Base 2 inside.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from ._launch import alignment_key, launch, next_pow2
from .configs import interpreter_active

# The split-K combine as a programmatic dependent launch (Hopper): its CTAs may start while the
# decode launch before it drains and wait (``gdc_wait``) for its partials (PDL_WAIT; the
# launches pass ``launch_pdl``), and the decode launch triggers it at its start (``PDL_TRIGGER``:
# griddepcontrol.launch_dependents, SASS PREEXIT). By the decode family before the combine:
# ``triton`` (paged_decode), ``gluon`` (gluon_decode), ``prefix`` (prefix_decode's suffix).
# H200, 2026-11-30 (twenty-eighth session), scripts/decode_fixed_cost.py --combine-pdl 0|1, two
# runs each, graphs, batch 1, us a call at 65536 / 131072 / 262144 keys, off -> on:
# - Gluon, MHA 12/12: fp8 53.5, 55.0 / 99.6, 101.0 / 194.1, 193.1 -> 52.7, 52.8 / 99.1, 98.7 /
#   192.1, 191.0; int8 56.0, 55.1 / 102.5, 101.4 / 196.8, 196.0 -> 54.6, 53.9 / 102.1, 100.3 /
#   195.9, 194.1: every pair faster, 1-2%. GQA 32/8: fp8 69.7, 70.2 -> 69.6, 70.5 at 131072,
#   int8 70.3, 71.0 -> 70.4, 71.1: even. On.
# - Triton, GQA 32/8 fp16: 131.4, 132.2 -> 132.4, 133.9 at 131072 (every pair 0.5-2 us slower),
#   MHA even. Off.
# - prefix: not measured. Off.
# Correct with every family on (92 decode, prefix and Gluon cases, none failed).
COMBINE_PDL = {"triton": False, "gluon": True, "prefix": False}


def combine_pdl(device: torch.device, family: str) -> bool:
    """Whether split combines after a ``family`` decode launch (a ``COMBINE_PDL`` key) on
    ``device`` launch as programmatic dependents, the decode launch triggering them early (its
    ``PDL_TRIGGER``): Hopper and later, never under the interpreter (``griddepcontrol`` is
    sm_90's)."""
    return COMBINE_PDL[family] and pdl_supported(device)


def pdl_supported(device: torch.device) -> bool:
    """Whether launches on ``device`` may be programmatic dependent launches: Hopper and later,
    never under the interpreter (``griddepcontrol`` is sm_90's)."""
    return (not interpreter_active() and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def set_combine_pdl(on: bool) -> None:
    """Every family's ``COMBINE_PDL`` to ``on`` (the device scripts' A/B switch)."""
    for family in COMBINE_PDL:
        COMBINE_PDL[family] = bool(on)


@triton.jit
def _merge_rows(acc, m, l, o, lse):
    """Fold one split's normalized partial rows into per-row merge states (state in, state out):
    ``acc, o [BLOCK_M, BLOCK_D]`` fp32, ``m, l, lse [BLOCK_M]`` (natural log), starting from
    ``(0, -inf, 0)``; a ``-inf`` row weighs exactly zero. ``_merge_chunk``'s arithmetic, with the
    splits folded one at a time and the rows side by side."""
    m_new = tl.maximum(m, lse)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2((m - m_safe) * 1.4426950408889634)
    w = tl.math.exp2((lse - m_safe) * 1.4426950408889634)
    acc = acc * alpha[:, None] + tl.where(w[:, None] > 0.0, o * w[:, None], 0.0)
    return acc, m_new, l * alpha + w


@triton.jit
def _split_partial(p_ptrs, l_ptrs, s, num_splits, stride_ps, stride_lps, mask, row_ok):
    """Split ``s``'s partial rows and LSE (nothing loaded past ``num_splits``: 0 and -inf)."""
    ok = s < num_splits
    o = tl.load(p_ptrs + s * stride_ps, mask=mask & ok, other=0.0, cache_modifier=".cg")
    lse = tl.load(l_ptrs + s * stride_lps, mask=row_ok & ok, other=float("-inf"),
                  cache_modifier=".cg")
    return o, lse


@triton.jit
def _combine_splits(Opart, Lpart, Out, Lse, seq, tok, head, row_ok, offs_d, num_splits, q_len,
                    nheads, head_dim, stride_pb, stride_pt, stride_ph, stride_ps,
                    stride_lpb, stride_lpt, stride_lph, stride_lps, STORE_LSE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS_AT_ONCE: tl.constexpr = 1):
    """Merge the ``num_splits`` partials of one program's packed rows and store the result
    (``out`` contiguous ``[batch, q_len, nheads, d]``, ``lse`` contiguous ``[batch, nheads,
    q_len]``), folding the splits in order. SPLITS_AT_ONCE (2 or 4): that many splits' loads
    are issued before any of them is folded (the same order, so the same bytes). One at a time
    each split costs an L2 round trip: compiled for sm_90a, the loop consumes a split's loads
    ~20-30 instructions after issuing them."""
    seq = seq.to(tl.int64)
    mask = row_ok[:, None] & (offs_d[None, :] < head_dim)
    p_ptrs = (Opart + seq * stride_pb + (tok * stride_pt + head * stride_ph)[:, None]
              + offs_d[None, :])
    l_ptrs = Lpart + seq * stride_lpb + tok * stride_lpt + head * stride_lph
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SPLITS_AT_ONCE == 1:
        for s in range(num_splits):
            o = tl.load(p_ptrs + s * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
            lse = tl.load(l_ptrs + s * stride_lps, mask=row_ok, other=float("-inf"),
                          cache_modifier=".cg")
            acc, m, l = _merge_rows(acc, m, l, o, lse)
    else:
        tl.static_assert(SPLITS_AT_ONCE == 2 or SPLITS_AT_ONCE == 4)
        for s0 in range(0, num_splits, SPLITS_AT_ONCE):
            # Splits past num_splits load nothing: their LSE is -inf, which weighs zero.
            o0, lse0 = _split_partial(p_ptrs, l_ptrs, s0, num_splits, stride_ps, stride_lps,
                                      mask, row_ok)
            o1, lse1 = _split_partial(p_ptrs, l_ptrs, s0 + 1, num_splits, stride_ps,
                                      stride_lps, mask, row_ok)
            if SPLITS_AT_ONCE == 4:
                o2, lse2 = _split_partial(p_ptrs, l_ptrs, s0 + 2, num_splits, stride_ps,
                                          stride_lps, mask, row_ok)
                o3, lse3 = _split_partial(p_ptrs, l_ptrs, s0 + 3, num_splits, stride_ps,
                                          stride_lps, mask, row_ok)
            acc, m, l = _merge_rows(acc, m, l, o0, lse0)
            acc, m, l = _merge_rows(acc, m, l, o1, lse1)
            if SPLITS_AT_ONCE == 4:
                acc, m, l = _merge_rows(acc, m, l, o2, lse2)
                acc, m, l = _merge_rows(acc, m, l, o3, lse3)
    seen = l > 0.0
    out = acc / tl.where(seen, l, 1.0)[:, None]
    o_ptrs = (Out + seq * q_len * nheads * head_dim
              + (tok * nheads * head_dim + head * head_dim)[:, None] + offs_d[None, :])
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask)
    if STORE_LSE:
        lse = tl.where(seen, m + tl.math.log2(tl.where(seen, l, 1.0)) * 0.6931471805599453,
                       float("-inf"))
        tl.store(Lse + seq * nheads * q_len + head * q_len + tok, lse, mask=row_ok)


@triton.jit
def _merge_chunk(acc, m, l, o, lse):
    """Fold a chunk of normalized partial results into a merge state (state in, state out).

    ``o [BLOCK_S, BLOCK_D]`` fp32, ``lse [BLOCK_S]`` fp32 natural log; the state is
    ``acc [BLOCK_D]`` (weighted sum of o), ``m`` (running max, natural log) and ``l`` (sum of
    weights), starting from ``(0, -inf, 0)``. A ``-inf`` entry weighs exactly zero, whatever its
    ``o`` holds. The split-K combine and ``merge_attention_states`` both run this code. Base 2
    inside."""
    # m stays in natural-log units (only the exponent is base 2) so that a lone finite input's
    # lse comes back bit for bit: m + log2(1) * ln 2 = m.
    m_new = tl.maximum(m, tl.max(lse, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2((m - m_safe) * 1.4426950408889634)
    w = tl.math.exp2((lse - m_safe) * 1.4426950408889634)
    acc = acc * alpha + tl.sum(tl.where(w[:, None] > 0.0, o * w[:, None], 0.0), 0)
    l = l * alpha + tl.sum(w, 0)
    return acc, m_new, l


@triton.jit
def _merge_finish(acc, m, l):
    """Merge state -> ``(o [BLOCK_D], lse)``; ``(0, -inf)`` when every input was ``-inf``."""
    seen = l > 0.0
    o = acc / tl.where(seen, l, 1.0)
    lse = tl.where(seen, m + tl.math.log2(tl.where(seen, l, 1.0)) * 0.6931471805599453,
                   float("-inf"))
    return o, lse


@triton.jit
def _combine_splits_kernel(
    Opart,             # float32 [batch, q_len, nheads, S, HEAD_DIM]
    Lpart,             # float32 [batch, q_len, nheads, S]
    Out,               # [batch, q_len, nheads, HEAD_DIM], q's dtype
    Lse,               # float32 [batch, nheads, q_len]
    num_splits, head_dim,
    stride_pb, stride_pt, stride_ph, stride_ps,
    stride_lpb, stride_lpt, stride_lph, stride_lps,
    stride_ob, stride_ot, stride_oh,
    stride_lb, stride_lt, stride_lh,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, STORE_LSE: tl.constexpr,
    D_SPLITS: tl.constexpr = 1, PDL_WAIT: tl.constexpr = False,
):
    """One program per (head, head-dim chunk, token, sequence): the S partials of its
    ``BLOCK_D`` channels (chunk ``pid0 % D_SPLITS``), BLOCK_S splits at a time (one chunk unless
    S > BLOCK_S), as whole tiles: a serial load-merge chain over the splits would cost a memory
    latency per split, and channel chunks put more programs on a combine of few heads (each
    recomputes its head's weights from the S LSEs; the first chunk stores the LSE)."""
    if PDL_WAIT:   # launched before the decode ends: its partials are whole only after this
        gdc_wait()
    head = tl.program_id(0) // D_SPLITS
    d_chunk = tl.program_id(0) % D_SPLITS
    tok = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    offs_d = d_chunk * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, BLOCK_S)
    d_ok = offs_d < head_dim
    p_base = Opart + seq * stride_pb + tok * stride_pt + head * stride_ph
    l_base = Lpart + seq * stride_lpb + tok * stride_lpt + head * stride_lph
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    m = tl.max(tl.full([BLOCK_S], float("-inf"), dtype=tl.float32), 0)
    l = tl.sum(tl.zeros([BLOCK_S], dtype=tl.float32), 0)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + offs_s
        s_ok = s < num_splits
        o = tl.load(p_base + s[:, None] * stride_ps + offs_d[None, :],
                    mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        lse = tl.load(l_base + s * stride_lps, mask=s_ok, other=float("-inf"))
        acc, m, l = _merge_chunk(acc, m, l, o, lse)
    o, lse = _merge_finish(acc, m, l)
    tl.store(Out + seq * stride_ob + tok * stride_ot + head * stride_oh + offs_d,
             o.to(Out.dtype.element_ty), mask=d_ok)
    if STORE_LSE:
        if d_chunk == 0:
            tl.store(Lse + seq * stride_lb + tok * stride_lt + head * stride_lh, lse)


def combine_launch_shape(nheads: int, q_len: int, batch: int, num_splits: int, block_d: int,
                         pdl: bool = False):
    """``(grid, constexprs, (num_warps, num_stages))`` of ``_combine_splits_kernel`` (``STORE_LSE``
    left to the caller): channel chunks of 32 and up to 128 splits a tile, so one program's
    merge is one or two rounds of independent loads (the combine after a long split-K: 198
    splits of 2 heads were 12 programs walking 7 rounds each). ``pdl`` (``combine_pdl``): a
    programmatic dependent launch (``PDL_WAIT``; launch it with
    ``launch_pdl=constexprs["PDL_WAIT"]``)."""
    chunk = min(32, block_d)
    d_splits = block_d // chunk
    constexprs = dict(BLOCK_S=min(128, next_pow2(num_splits)), BLOCK_D=chunk,
                      D_SPLITS=d_splits, PDL_WAIT=pdl)
    return (nheads * d_splits, q_len, batch), constexprs, (4, 3)


@triton.jit
def _merge_states_kernel(
    Oa, La, Ob, Lb, Out, Lse,   # o: [n, nheads, HEAD_DIM]; lse: float32 [n, nheads]
    head_dim,
    stride_oan, stride_oah, stride_obn, stride_obh, stride_on, stride_oh,
    stride_lan, stride_lah, stride_lbn, stride_lbh, stride_ln, stride_lh,
    BLOCK_D: tl.constexpr,
):
    """One program per (row, head): the two inputs as one 2-row chunk of ``_merge_chunk``."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    side = tl.arange(0, 2)
    d_ok = offs_d < head_dim
    is_a = side == 0
    o_ptrs = tl.where(is_a[:, None], Oa + row * stride_oan + head * stride_oah + offs_d[None, :],
                      Ob + row * stride_obn + head * stride_obh + offs_d[None, :])
    l_ptrs = tl.where(is_a, La + row * stride_lan + head * stride_lah,
                      Lb + row * stride_lbn + head * stride_lbh)
    o = tl.load(o_ptrs, mask=d_ok[None, :] & (side[:, None] < 2), other=0.0).to(tl.float32)
    lse = tl.load(l_ptrs)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    m = tl.max(tl.full([2], float("-inf"), dtype=tl.float32), 0)
    l = tl.sum(tl.zeros([2], dtype=tl.float32), 0)
    acc, m, l = _merge_chunk(acc, m, l, o, lse)
    o, lse = _merge_finish(acc, m, l)
    tl.store(Out + row * stride_on + head * stride_oh + offs_d, o.to(Out.dtype.element_ty),
             mask=d_ok)
    tl.store(Lse + row * stride_ln + head * stride_lh, lse)



def launch_merge_states(o_a, lse_a, o_b, lse_b, out, lse) -> None:
    """``out, lse = merge(o_a, lse_a, o_b, lse_b)`` row by row (shapes checked by the caller)."""
    n, nheads, head_dim = o_a.shape
    if n == 0 or nheads == 0:
        return
    block_d = max(16, next_pow2(head_dim))
    ints = (head_dim, o_a.stride(0), o_a.stride(1), o_b.stride(0), o_b.stride(1), out.stride(0),
            out.stride(1), lse_a.stride(0), lse_a.stride(1), lse_b.stride(0), lse_b.stride(1),
            lse.stride(0), lse.stride(1))
    num_warps = 1 if block_d <= 128 else 2
    key = (o_a.dtype, ints, block_d, alignment_key(o_a, lse_a, o_b, lse_b, out, lse))
    launch(_merge_states_kernel, key, (n, nheads, 1), (o_a, lse_a, o_b, lse_b, out, lse, *ints),
           dict(BLOCK_D=block_d), num_warps, 3,
           o_a.device.index if o_a.device.type == "cuda" else -1)
