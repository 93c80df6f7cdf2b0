"""Plain PyTorch math for every public op, float32 (float64 on request for gradient checks): the
truth for tests and the CPU fallback.

Nothing here is fast; everything here is obvious. Loops over sequences are fine in this module
(and only in this module and the benchmarks).

Conventions (DESIGN.md): varlen "THD" layout, GQA head ``h`` reads kv head ``h // (nheads //
nheads_k)``, causal masks are bottom-right aligned, LSE is float32 natural log in
``[nheads, total_q]``, and a row that sees no key returns ``out = 0`` and ``lse = -inf``.
"""
from __future__ import annotations


import torch

__all__ = [
    "attention_ref",
    "varlen_attention_ref",
    "dual_group_attention_ref",
    "paged_attention_ref",
    "paged_attention_sdpa_ref",
    "paged_prefill_ref",
    "merge_attention_states_ref",
]


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one sequence in ``compute_dtype`` (float32 by default).

    Parameters
    ----------
    q : ``[len_q, nheads, headdim]``
    k, v : ``[len_k, nheads_k, headdim]``, ``nheads % nheads_k == 0``
    compute_dtype : the inputs are cast to it and all math runs in it (``torch.float64`` for
        gradient checks: the result is differentiable in ``q``, ``k``, ``v``).

    Returns
    -------
    out : ``compute_dtype`` ``[len_q, nheads, headdim]`` (zeros for rows that see no key)
    lse : ``compute_dtype`` ``[nheads, len_q]``, natural log (``-inf`` for rows that see no key)

    With ``causal``, row ``i`` sees key ``j`` iff ``j <= i + len_k - len_q`` (bottom-right)::

        len_q=2, len_k=4:   1 1 1 0
                            1 1 1 1

    Autograd: masked scores enter the softmax as ``exp(-inf) = 0`` and the stabilizing row max is
    detached, so a row that sees no key (and every masked key) gets exactly zero gradient, never
    NaN (``torch.logsumexp`` of an all ``-inf`` row would back-propagate ``0 * nan``).
    """
    len_q, nheads, headdim = q.shape
    len_k, nheads_k = k.shape[0], k.shape[1]
    scale = headdim ** -0.5 if softmax_scale is None else softmax_scale
    group = nheads // nheads_k
    qf = q.to(compute_dtype).transpose(0, 1)  # [nheads, len_q, d]
    kf = k.to(compute_dtype).repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.to(compute_dtype).repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale  # [nheads, len_q, len_k]
    rows = torch.arange(len_q, device=q.device)[:, None]
    cols = torch.arange(len_k, device=q.device)[None, :]
    if causal:
        visible = cols <= rows + (len_k - len_q)  # [len_q, len_k]
    else:
        visible = torch.ones((len_q, len_k), dtype=torch.bool, device=q.device)
    seen = visible.any(dim=-1)  # [len_q]; False for every row when len_k == 0
    scores = scores.masked_fill(~visible, float("-inf"))
    if len_k == 0:
        row_max = scores.new_zeros((nheads, len_q))
    else:
        row_max = scores.detach().amax(dim=-1)  # -inf on rows that see nothing
    row_max = torch.where(seen, row_max, torch.zeros_like(row_max))
    sums = torch.exp(scores - row_max[..., None]).sum(dim=-1)  # 0 on rows that see nothing
    lse_safe = row_max + torch.log(torch.where(seen, sums, torch.ones_like(sums)))  # finite
    lse = torch.where(seen, lse_safe, torch.full_like(lse_safe, float("-inf")))
    probs = torch.exp(scores - lse_safe[..., None])  # masked entries, unseen rows: exp(-inf) = 0
    out = torch.matmul(probs, vf).transpose(0, 1)  # [len_q, nheads, d]; 0 on unseen rows
    return out.contiguous(), lse


def varlen_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    kv_end: torch.Tensor | list[int] | int | None = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention in ``compute_dtype`` (float32 by default) with a visible key range per
    sequence.

    Parameters
    ----------
    q : ``[total_q, nheads, headdim]``
    k, v : ``[total_k, nheads_k, headdim]``
    cu_seqlens_q, cu_seqlens_k : int32 ``[batch + 1]``
    kv_end : sequence ``b`` sees ``k[cu_k[b] : cu_k[b] + min(kv_end[b], len_k[b])]``; an int
        applies to every sequence, ``None`` means all of its keys. Causal masking is
        bottom-right within that visible range.
    compute_dtype : dtype of all math and of the results; differentiable in ``q``, ``k``, ``v``
        (rows that see no key, keys no row sees and rows of ``k``/``v`` past ``cu_seqlens_k[-1]``
        get zero gradient).

    Returns
    -------
    out : ``compute_dtype`` ``[total_q, nheads, headdim]``
    lse : ``compute_dtype`` ``[nheads, total_q]``, natural log, ``-inf`` for rows that see no key
    """
    cu_q = [int(x) for x in cu_seqlens_q.tolist()]
    cu_k = [int(x) for x in cu_seqlens_k.tolist()]
    batch = len(cu_q) - 1
    if kv_end is None:
        ends = [cu_k[b + 1] - cu_k[b] for b in range(batch)]
    elif isinstance(kv_end, int):
        ends = [kv_end] * batch
    else:
        ends = [int(x) for x in (kv_end.tolist() if torch.is_tensor(kv_end) else kv_end)]
    nheads = q.shape[1]
    out = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    lse = torch.full((nheads, q.shape[0]), float("-inf"), dtype=compute_dtype, device=q.device)
    for b in range(batch):
        q_b = q[cu_q[b] : cu_q[b + 1]]
        if q_b.shape[0] == 0:
            continue
        end = max(0, min(ends[b], cu_k[b + 1] - cu_k[b]))
        k_b = k[cu_k[b] : cu_k[b] + end]
        v_b = v[cu_k[b] : cu_k[b] + end]
        o_b, lse_b = attention_ref(q_b, k_b, v_b, softmax_scale=softmax_scale, causal=causal,
                                   compute_dtype=compute_dtype)
        out[cu_q[b] : cu_q[b + 1]] = o_b
        lse[:, cu_q[b] : cu_q[b + 1]] = lse_b
    return out, lse


def dual_group_attention_ref(
    q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, max_kv_len_q0, max_kv_len_q1,
    *, softmax_scale: float | None = None, causal: bool = True,
    compute_dtype: torch.dtype = torch.float32,
):
    """Reference for ``fused_zigzag_llama3_flash_attn_varlen_forward``: two independent varlen
    calls, group ``g`` seeing ``min(max_kv_len_qg, len_k)`` keys of each sequence.

    ``q0 [total_q0, nheads, d]``, ``q1 [total_q1, nheads, d]``, ``k, v [total_k, nheads_k, d]``,
    ``cu_seqlens_*`` int32 ``[batch + 1]``, ``max_kv_len_q*`` an int or int32 ``[batch]``.

    Returns ``(out0, out1, lse0, lse1)`` in ``compute_dtype`` (float32 by default; differentiable
    in ``q0``, ``q1``, ``k``, ``v``), ``out_g [total_qg, nheads, d]``, LSE ``[nheads, total_qg]``.
    """
    out0, lse0 = varlen_attention_ref(q0, k, v, cu_seqlens_q0, cu_seqlens_k, kv_end=max_kv_len_q0,
                                      softmax_scale=softmax_scale, causal=causal,
                                      compute_dtype=compute_dtype)
    out1, lse1 = varlen_attention_ref(q1, k, v, cu_seqlens_q1, cu_seqlens_k, kv_end=max_kv_len_q1,
                                      softmax_scale=softmax_scale, causal=causal,
                                      compute_dtype=compute_dtype)
    return out0, out1, lse0, lse1


# ---------------------------------------------------------------------------------------------
# Paged KV-cache decode (kvonce.paged.decode)
# ---------------------------------------------------------------------------------------------

def _gather_pages(cache: torch.Tensor, block_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """First ``length`` tokens of one sequence from a paged cache ``[num_pages, page_size, h, d]``
    -> ``[length, h, d]``."""
    page_size = cache.shape[1]
    n_pages = -(-length // page_size)
    pages = cache[block_table_row[:n_pages].long()]  # [n_pages, page_size, h, d]
    return pages.reshape(-1, *cache.shape[2:])[:length]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged decode attention, one sequence at a time, in ``compute_dtype`` (float32 by default;
    float64 for precision checks) (the "simple" version).

    Parameters
    ----------
    q : ``[batch, q_len, nheads, headdim]``: the newest ``q_len`` tokens of each sequence
    k_cache, v_cache : ``[num_pages, page_size, nheads_k, headdim]``
    cache_seqlens : int32 ``[batch]``: keys of sequence ``b`` are its first ``cache_seqlens[b]``
        cache positions; position ``p`` lives at ``cache[block_table[b, p // page_size],
        p % page_size]``
    block_table : int32 ``[batch, max_pages]``

    Returns
    -------
    out : ``compute_dtype`` ``[batch, q_len, nheads, headdim]``
    lse : ``compute_dtype`` ``[batch, nheads, q_len]``, natural log; ``-inf`` (and ``out = 0``) for a row
        that sees no key. Causal is bottom-right: row ``t`` sees key ``j <= t + seqlen - q_len``.
    """
    batch, q_len, nheads, _ = q.shape
    out = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    lse = torch.full((batch, nheads, q_len), float("-inf"), dtype=compute_dtype, device=q.device)
    for b, length in enumerate(int(x) for x in cache_seqlens.tolist()):
        k_b = _gather_pages(k_cache, block_table[b], length)
        v_b = _gather_pages(v_cache, block_table[b], length)
        out[b], lse[b] = attention_ref(q[b], k_b, v_b, softmax_scale=softmax_scale, causal=causal,
                                       compute_dtype=compute_dtype)
    return out, lse


def paged_attention_sdpa_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    upcast: bool = True,
) -> torch.Tensor:
    """Paged decode attention through ``F.scaled_dot_product_attention`` on the gathered dense cache.

    All sequences at once: the block table gathers a padded ``[batch, max_pages * page_size,
    nheads_k, headdim]`` cache and a boolean mask hides padding (and, with ``causal``, keys past
    each row's bottom-right diagonal). ``upcast`` computes in float32; otherwise in q's dtype.

    Returns ``out`` ``[batch, q_len, nheads, headdim]`` (float32 with ``upcast``); rows that see no
    key are 0. (SDPA returns no LSE; ``paged_attention_ref`` gives it.)
    """
    batch, q_len, nheads, headdim = q.shape
    nheads_k = k_cache.shape[2]
    dtype = torch.float32 if upcast else q.dtype
    max_pages = block_table.shape[1]
    idx = block_table.long()
    k = k_cache[idx].reshape(batch, -1, nheads_k, headdim).to(dtype)  # [batch, max_len, hk, d]
    v = v_cache[idx].reshape(batch, -1, nheads_k, headdim).to(dtype)
    max_len = max_pages * k_cache.shape[1]
    cols = torch.arange(max_len, device=q.device)[None, None, :]
    lens = cache_seqlens.long()[:, None, None]
    visible = cols < lens  # [batch, 1, max_len]
    if causal:
        rows = torch.arange(q_len, device=q.device)[None, :, None]
        visible = visible & (cols <= rows + lens - q_len)  # [batch, q_len, max_len]
    visible = visible.expand(batch, q_len, max_len)[:, None]  # [batch, 1, q_len, max_len]
    group = nheads // nheads_k
    qt = q.to(dtype).transpose(1, 2)
    kt = k.repeat_interleave(group, dim=2).transpose(1, 2)
    vt = v.repeat_interleave(group, dim=2).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=visible, scale=softmax_scale)  # [batch, nheads, q_len, d]
    any_key = visible.any(dim=-1, keepdim=True)  # all-masked rows come back NaN from SDPA
    out = torch.where(any_key, out, torch.zeros_like(out))
    return out.transpose(1, 2).contiguous()


def paged_prefill_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen paged attention (``kvonce.paged.prefill``), one sequence at a time, in
    ``compute_dtype`` (float32 by default).

    ``q [total_q, nheads, headdim]``: sequence ``b``'s rows ``cu_seqlens_q[b] ..
    cu_seqlens_q[b + 1]`` are its newest tokens, already among its ``cache_seqlens[b]`` cache
    positions; caches and ``block_table`` as in ``paged_attention_ref``. Returns ``out``
    ``[total_q, nheads, headdim]`` and ``lse`` ``[nheads, total_q]`` in ``compute_dtype`` (natural log;
    ``-inf`` and ``out = 0`` for a row that sees no key). Causal is bottom-right: row ``i`` sees
    key ``j <= i + cache_seqlens[b] - q_len_b``.
    """
    total_q, nheads, _ = q.shape
    out = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    lse = torch.full((nheads, total_q), float("-inf"), dtype=compute_dtype, device=q.device)
    cu = [int(x) for x in cu_seqlens_q.tolist()]
    for b, length in enumerate(int(x) for x in cache_seqlens.tolist()):
        if cu[b + 1] == cu[b]:
            continue
        k_b = _gather_pages(k_cache, block_table[b], length)
        v_b = _gather_pages(v_cache, block_table[b], length)
        out[cu[b]:cu[b + 1]], lse[:, cu[b]:cu[b + 1]] = attention_ref(
            q[cu[b]:cu[b + 1]], k_b, v_b, softmax_scale=softmax_scale, causal=causal,
            compute_dtype=compute_dtype)
    return out, lse


def merge_attention_states_ref(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LSE-weighted merge of two partial attention results, in float32.

    ``o_* [n, nheads, headdim]``, ``lse_* [n, nheads]`` float32 natural log. A side with
    ``lse = -inf`` weighs zero; if both are ``-inf`` the result is ``(0, -inf)``.
    """
    lse = torch.logaddexp(lse_a.float(), lse_b.float())
    finite = torch.isfinite(lse)
    safe = torch.where(finite, lse, torch.zeros_like(lse))
    w_a = torch.exp(lse_a.float() - safe)[..., None]
    w_b = torch.exp(lse_b.float() - safe)[..., None]
    out = w_a * o_a.float().nan_to_num() + w_b * o_b.float().nan_to_num()
    out = torch.where(finite[..., None], out, torch.zeros_like(out))
    return out, lse
