"""``flash_attn_with_kvcache``: flash-attn's drop-in name and arguments for the paged subset,
on top of ``append_paged_kv`` (new tokens first) and ``paged_attention``."""
from __future__ import annotations

import torch

from .append import append_paged_kv
from .decode import paged_attention

__all__ = ["flash_attn_with_kvcache"]


_UNSUPPORTED_DEFAULTS = {
    "rotary_cos": None, "rotary_sin": None, "cache_batch_idx": None, "cache_leftpad": None,
    "window_size": (-1, -1), "softcap": 0.0, "alibi_slopes": None,
}


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
    cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
    window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
    return_softmax_lse=False,
):
    """flash-attn's ``flash_attn_with_kvcache`` for the paged subset kvonce implements.

    Same names, defaults (``causal=False``) and semantics: with ``k, v`` given, they are written at
    ``cache_seqlens ..`` first and attention sees ``cache_seqlens + new_len`` keys
    (``cache_seqlens`` itself is not advanced); ``cache_seqlens`` may be an int. ``block_table``
    is required (paged cache). ``rotary_cos/sin``, ``cache_batch_idx``, ``cache_leftpad``, a
    sliding ``window_size``, ``softcap`` and ``alibi_slopes`` raise NotImplementedError naming
    them.

    Returns ``out [batch, q_len, nheads, headdim]``, and ``softmax_lse`` float32
    ``[batch, nheads, q_len]`` with ``return_softmax_lse``.
    """
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
        append_paged_kv(k, v, k_cache, v_cache, cache_seqlens, block_table)
        seqlens = cache_seqlens + k.shape[1]  # a device op: no sync
    return paged_attention(q, k_cache, v_cache, seqlens, block_table, softmax_scale=softmax_scale,
                           causal=causal, num_splits=num_splits, return_lse=return_softmax_lse)
