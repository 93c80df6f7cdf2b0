"""Plain PyTorch float32 math for every public op: the truth for tests and the CPU fallback.

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
]


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one sequence in float32.

    Parameters
    ----------
    q : ``[len_q, nheads, headdim]``
    k, v : ``[len_k, nheads_k, headdim]``, ``nheads % nheads_k == 0``

    Returns
    -------
    out : float32 ``[len_q, nheads, headdim]`` (zeros for rows that see no key)
    lse : float32 ``[nheads, len_q]``, natural log (``-inf`` for rows that see no key)

    With ``causal``, row ``i`` sees key ``j`` iff ``j <= i + len_k - len_q`` (bottom-right)::

        len_q=2, len_k=4:   1 1 1 0
                            1 1 1 1
    """
    len_q, nheads, headdim = q.shape
    len_k, nheads_k = k.shape[0], k.shape[1]
    scale = headdim ** -0.5 if softmax_scale is None else softmax_scale
    group = nheads // nheads_k
    qf = q.float().transpose(0, 1)  # [nheads, len_q, d]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale  # [nheads, len_q, len_k]
    if causal:
        rows = torch.arange(len_q, device=q.device)[:, None]
        cols = torch.arange(len_k, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (len_k - len_q), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [nheads, len_q]; -inf for empty rows
    seen = torch.isfinite(lse)
    probs = torch.exp(scores - torch.where(seen, lse, torch.zeros_like(lse))[..., None])
    out = torch.matmul(probs, vf).transpose(0, 1)  # [len_q, nheads, d]
    out = torch.where(seen.transpose(0, 1)[..., None], out, torch.zeros_like(out))
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention in float32 with a visible key range per sequence.

    Parameters
    ----------
    q : ``[total_q, nheads, headdim]``
    k, v : ``[total_k, nheads_k, headdim]``
    cu_seqlens_q, cu_seqlens_k : int32 ``[batch + 1]``
    kv_end : sequence ``b`` sees ``k[cu_k[b] : cu_k[b] + min(kv_end[b], len_k[b])]``; an int
        applies to every sequence, ``None`` means all of its keys. Causal masking is
        bottom-right within that visible range.

    Returns
    -------
    out : float32 ``[total_q, nheads, headdim]``
    lse : float32 ``[nheads, total_q]``
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
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((nheads, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(batch):
        q_b = q[cu_q[b] : cu_q[b + 1]]
        if q_b.shape[0] == 0:
            continue
        end = max(0, min(ends[b], cu_k[b + 1] - cu_k[b]))
        k_b = k[cu_k[b] : cu_k[b] + end]
        v_b = v[cu_k[b] : cu_k[b] + end]
        o_b, lse_b = attention_ref(q_b, k_b, v_b, softmax_scale=softmax_scale, causal=causal)
        out[cu_q[b] : cu_q[b + 1]] = o_b
        lse[:, cu_q[b] : cu_q[b + 1]] = lse_b
    return out, lse


def dual_group_attention_ref(
    q0, q1, k, v, cu_seqlens_q0, cu_seqlens_q1, cu_seqlens_k, max_kv_len_q0, max_kv_len_q1,
    *, softmax_scale: float | None = None, causal: bool = True,
):
    """Reference for ``fused_zigzag_llama3_flash_attn_varlen_forward``: two independent varlen
    calls, group ``g`` seeing ``min(max_kv_len_qg, len_k)`` keys of each sequence.

    Returns ``(out0, out1, lse0, lse1)`` in float32, LSE in ``[nheads, total_qg]``.
    """
    out0, lse0 = varlen_attention_ref(q0, k, v, cu_seqlens_q0, cu_seqlens_k, kv_end=max_kv_len_q0,
                                      softmax_scale=softmax_scale, causal=causal)
    out1, lse1 = varlen_attention_ref(q1, k, v, cu_seqlens_q1, cu_seqlens_k, kv_end=max_kv_len_q1,
                                      softmax_scale=softmax_scale, causal=causal)
    return out0, out1, lse0, lse1


