"""flash-attn's drop-in names for the subset kvonce implements: ``flash_attn_with_kvcache`` on top
of ``append_paged_kv`` (new tokens first) and ``paged_attention``; ``flash_attn_varlen_func`` on
top of ``paged_prefill`` (paged K/V) or the dual-group varlen forward (contiguous K/V)."""
from __future__ import annotations

import torch

from .. import varlen
from .append import append_paged_kv
from .decode import paged_attention
from .key_transform import KeyTransform
from .prefill import paged_prefill

__all__ = ["flash_attn_with_kvcache", "flash_attn_varlen_func"]


_UNSUPPORTED_DEFAULTS = {
    "rotary_cos": None, "rotary_sin": None, "cache_batch_idx": None, "cache_leftpad": None,
    "window_size": (-1, -1), "softcap": 0.0, "alibi_slopes": None,
}


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
    cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
    window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
    return_softmax_lse=False, *, key_transform: KeyTransform | None = None,
):
    """flash-attn's ``flash_attn_with_kvcache`` for the paged subset kvonce implements.

    Same names, defaults (``causal=False``) and semantics: with ``k, v`` given, they are written at
    ``cache_seqlens ..`` first and attention sees ``cache_seqlens + new_len`` keys
    (``cache_seqlens`` itself is not advanced); ``cache_seqlens`` may be an int. ``block_table``
    is required (paged cache). ``rotary_cos/sin``, ``cache_batch_idx``, ``cache_leftpad``, a
    sliding ``window_size``, ``softcap`` and ``alibi_slopes`` raise NotImplementedError naming
    them.

    ``key_transform`` (kvonce's, keyword-only): a ``kvonce.paged.KeyTransform`` the cache's keys
    are stored through; the new ``k`` is appended through it and ``q`` is transformed to match
    (``paged_attention(..., key_transform=)``), so the output and LSE are those of the original
    keys. A ValueError without ``block_table`` (it needs the paged cache).

    Returns ``out [batch, q_len, nheads, headdim]``, and ``softmax_lse`` float32
    ``[batch, nheads, q_len]`` with ``return_softmax_lse``.
    """
    if key_transform is not None and block_table is None:
        raise ValueError("key_transform needs a paged cache (block_table); got block_table=None")
    given = {"rotary_cos": rotary_cos, "rotary_sin": rotary_sin,
             "cache_batch_idx": cache_batch_idx, "cache_leftpad": cache_leftpad,
             "window_size": tuple(window_size) if window_size is not None else None,
             "softcap": softcap, "alibi_slopes": alibi_slopes}
    bad = [name for name, val in given.items() if val != _UNSUPPORTED_DEFAULTS[name]
           and not (name == "window_size" and val is None)]
    if block_table is None:
        bad.append("block_table=None (dense, non-paged cache)")
    if cache_seqlens is None:
        bad.append("cache_seqlens=None")
    if bad:
        raise NotImplementedError("kvonce.flash_attn_with_kvcache does not support: "
                                  + ", ".join(bad))
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together")
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    seqlens = cache_seqlens
    if k is not None:
        append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table,
                        key_transform=key_transform)
        seqlens = cache_seqlens + k.shape[1]  # a device op: no sync
    return paged_attention(q, k_cache, v_cache, seqlens, block_table, softmax_scale=softmax_scale,
                           causal=causal, num_splits=num_splits, return_lse=return_softmax_lse,
                           key_transform=key_transform)


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False, block_table=None, *,
    key_transform: KeyTransform | None = None,
):
    """flash-attn 2's ``flash_attn_varlen_func`` for the subset kvonce implements.

    Same names, defaults (``causal=False``) and semantics; causal is bottom-right (row ``i`` of a
    sequence with ``Lq`` rows and ``Lk`` keys sees key ``j <= i + Lk - Lq``).

    - With ``block_table`` (int32 ``[batch, max_pages]``): ``k``, ``v`` are paged caches
      ``[num_pages, page_size, nheads_k, headdim]`` and ``cu_seqlens_k`` the cumulative key
      counts (sequence ``b`` has ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` keys, its q rows the
      newest of them): ``kvonce.paged_prefill``, forward only.
    - Without: contiguous varlen ``k``, ``v`` ``[total_k, nheads_k, headdim]``, through the
      dual-group forward with an empty second group (differentiable).

    ``dropout_p``, a sliding ``window_size``, ``softcap``, ``alibi_slopes`` and ``deterministic``
    with gradients on the contiguous path raise NotImplementedError naming them.

    ``key_transform`` (kvonce's, keyword-only; paged path only, a ValueError without
    ``block_table``): a ``kvonce.paged.KeyTransform`` the cache's keys were stored through, as in
    ``paged_prefill``; the output and LSE are those of the original keys.

    Returns ``out [total_q, nheads, headdim]`` in q's dtype, or with ``return_attn_probs``
    ``(out, softmax_lse float32 [nheads, total_q], None)`` (no attention probabilities).
    """
    if key_transform is not None and block_table is None:
        raise ValueError("key_transform is for a paged cache (block_table); the contiguous "
                         "k, v path takes keys as they are")
    bad = []
    if dropout_p != 0.0:
        bad.append(f"dropout_p={dropout_p}")
    if window_size is not None and tuple(window_size) != (-1, -1):
        bad.append(f"window_size={tuple(window_size)}")
    if softcap != 0.0:
        bad.append(f"softcap={softcap}")
    if alibi_slopes is not None:
        bad.append("alibi_slopes")
    wants_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    if block_table is not None and wants_grad:
        bad.append("gradients with block_table (the paged path is forward only)")
    if deterministic and wants_grad and block_table is None:
        bad.append("deterministic=True (the contiguous backward may use fp32 atomics)")
    if bad:
        raise NotImplementedError("kvonce.flash_attn_varlen_func does not support: "
                                  + ", ".join(bad))
    if block_table is not None:
        if not isinstance(cu_seqlens_k, torch.Tensor):
            raise TypeError(f"cu_seqlens_k must be a torch.Tensor, got "
                            f"{type(cu_seqlens_k).__name__}")
        cache_seqlens = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)  # device op
        out, lse = paged_prefill(q, k, v, cu_seqlens_q, cache_seqlens, block_table,
                                 max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale,
                                 causal=causal, return_lse=True, key_transform=key_transform)
    else:
        # The second group is empty (no rows, every sequence 0 keys); the first sees each
        # sequence's whole key range (total_k bounds every length).
        empty_q = q.new_empty((0, *q.shape[1:]))
        no_rows = torch.zeros_like(cu_seqlens_q)
        out, _, lse, _ = varlen.fused_zigzag_llama3_flash_attn_varlen_func(
            q, empty_q, k, v, cu_seqlens_q, no_rows, cu_seqlens_k, max_seqlen_q, 0,
            max_seqlen_k, k.shape[0], 0, softmax_scale, causal, return_lse=True)
    return (out, lse, None) if return_attn_probs else out
