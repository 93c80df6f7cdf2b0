"""HF transformers continuous batching (``generate_batch``) with kvonce's varlen paged attention.

    import kvonce.integrations.hf as kv_hf
    kv_hf.register()        # adds "paged|kvonce" (and "kvonce", see below) to AttentionInterface
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="paged|kvonce")
    out = model.generate_batch(prompts, generation_config)

Supported: transformers 5.17 to 5.24 (CPU-tested on 5.17.0, 5.23.0 and 5.24.0: ``make
test-hf-matrix``). Each call decides from what arrives, never from a version string:

* **In place** (the path kvonce exists for): the attention function gets transformers'
  ``PagedAttentionCache`` as ``cache`` and the batch's new K/V. It writes them at
  ``write_index`` into this layer's pages, derives a kvonce block table from ``read_index`` on
  the device, and runs one ``kvonce.paged_prefill`` over the pages where they lie: no gathered
  copy of the history, no mask. transformers 5.17 and 5.23 pass the cache this way; 5.24 does
  with the ``PagedAttentionCache.update`` wrapper below.
* **Gathered fallback** (correct, slower): no cache arrives, but ``write_index`` and
  ``cu_seq_lens_q`` do. That is transformers >= 5.24 when the wrapper is not in force: the
  model's attention layer called ``cache.update(k, v, layer_idx, kwargs=kwargs)`` first, which
  wrote the new K/V into the cache and passes a contiguous copy of every sequence's past+new K/V
  (``cu_seq_lens_k``/``max_length_k`` narrowed to the layer). kvonce's contiguous
  ``flash_attn_varlen_func`` (bottom-right causal) runs over that copy. transformers paid the
  gather in every layer of every step (under CUDA graphs, over the padded read size).
* Anything else raises ValueError (not under continuous batching).

Patches to transformers, the fewest that work, each idempotent and acting only for the kvonce
names (every other attention implementation goes through the original unchanged):

1. ``ContinuousBatchingManager.switch_to_cb_friendly_attn``: 5.23 and later accept only
   ``paged|eager``, ``sdpa`` and flash names for continuous batching; the wrapper lets the
   kvonce names through unchanged (5.17 leaves any ``paged|`` name alone anyway).
2. ``PagedAttentionCache.update``, installed only where ``update`` has a ``kwargs`` parameter
   (5.23 and later; 5.17's takes ``read_index``/``write_index`` and never sees kvonce's calls):
   for a model whose implementation is a kvonce name, it puts the cache into the layer's
   attention kwargs and returns the K/V untouched (no write, no gather), so the attention
   function gets the cache and takes the in-place path. 5.23's models never call it under
   continuous batching, 5.24's always do. It is not ``functools.wraps``'d: that would copy the
   original's ``torch.compiler.disable`` marks onto it.

What the in-place path reads on each release:
* names: 5.17 keeps ``"paged|kvonce"`` as the model's implementation; 5.23 and 5.24 strip the
  ``paged|`` prefix when the model is loaded and when the function is looked up (``"kvonce"``).
  Both names are registered.
* cache: 5.17's ``PagedAttentionCache`` has ``key_cache[j]``/``value_cache[j]``, flat
  ``[(num_blocks + 2) * block_size, Hk, D]`` tensors shared by layer ``j`` of every layer group
  (``layer_index_to_group_indices``), viewed here as ``[pages, block_size, Hk, D]``. 5.23 and
  5.24 have one byte tensor split by allocators (``layer_to_allocator``); layer ``i`` of a
  full-attention allocator sees a token view (``_kv_token_views``) and a page view
  ``[pages, page_size, Hk, D]`` (``get_cache_for_block_table``). Either way slot ``s`` lies on
  page ``s // page_size``: kvonce's layout, read in place.
* kwargs: ``max_seqlen_q``/``max_seqlen_k`` (5.17) or ``max_length_q``/``max_length_k`` (5.23
  on); ``cu_seq_lens_k`` and the k max may be dicts keyed by layer type; ``read_index`` (one
  tensor per layer group) is empty when no request of the batch has past KV (then
  ``write_index`` lists every token's slot). 5.17 also builds a 4D mask for any non-flash name;
  it is ignored here.

Decode fast path (``block_table`` given): not taken. transformers turns it on only for
flash-attention names (``ensure_decode_fast_path_is_available``), so a "kvonce" model always
gets the varlen kwargs; a call with a block table raises NotImplementedError rather than reading
an unwritten cache. Sliding-window layers are refused. CUDA graphs: neither path has a host
sync; the in-place path ran under transformers' CUDA graphs on an H100 with 5.17, the fallback
only on CPU.
"""
from __future__ import annotations

import inspect

import torch

from ..paged.flash_attn import flash_attn_varlen_func
from ..paged.prefill import paged_prefill

NAME = "paged|kvonce"
NAMES = (NAME, NAME.removeprefix("paged|"))


def block_table_from_read_index(read_index: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                max_seqlen_k: int, page_size: int) -> torch.Tensor:
    """int32 ``[batch, ceil(max_seqlen_k / page_size)]`` block table, built on the device.

    ``read_index``: flat slot of every past+new token, sequence by sequence in order (sequence
    ``b``'s run is ``cu_seqlens_k[b] .. cu_seqlens_k[b + 1]``). Column ``j`` of row ``b`` is the
    page of the run's token ``j * page_size``; columns past a sequence's length (and every column
    of a length-0 padding row) are 0, a page that exists and that kvonce never reads for them.
    """
    batch = cu_seqlens_k.shape[0] - 1
    width = max(-(-int(max_seqlen_k) // page_size), 1)
    cu = cu_seqlens_k.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    offs = torch.arange(width, device=cu.device, dtype=torch.int64) * page_size
    valid = offs[None, :] < lens[:, None]
    if read_index.numel() == 0:
        return torch.zeros(batch, width, dtype=torch.int32, device=cu.device)
    pos = (cu[:-1, None] + offs[None, :]).clamp_(max=read_index.shape[0] - 1)
    pages = torch.div(read_index.to(torch.int64)[pos], page_size, rounding_mode="floor")
    return torch.where(valid, pages, torch.zeros_like(pages)).to(torch.int32).contiguous()


def _per_layer_type(value, layer_type):
    return value[layer_type] if isinstance(value, dict) else value


def _layer_cache(cache, layer_idx: int):
    """``(group, layer_type, page_size, (k, v) flat token views [slots, Hk, D],
    (k, v) page views [pages, page_size, Hk, D])`` of one layer, on either cache layout."""
    if hasattr(cache, "layer_to_allocator"):
        # 5.23: one byte tensor split by allocators, each owning a group of layers
        allocator = cache.layer_to_allocator[layer_idx]
        return (allocator.index, allocator.layer_type, allocator.tokens_per_page,
                allocator._kv_token_views[layer_idx],
                allocator.get_cache_for_block_table(layer_idx))
    # 5.17: key_cache[j]/value_cache[j] are [(num_blocks + 2) * block_size, Hk, D], shared by
    # layer j of every group; sliding_windows[layer] is 1 for full-attention layers
    group, j = cache.layer_index_to_group_indices[layer_idx]
    layer_type = "full_attention" if cache.sliding_windows[layer_idx] == 1 else "sliding_attention"
    k, v = cache.key_cache[j], cache.value_cache[j]
    bs = cache.block_size
    return (group, layer_type, bs, (k, v),
            (k.view(-1, bs, *k.shape[1:]), v.view(-1, bs, *v.shape[1:])))


def _is_paged_cache(cache) -> bool:
    """transformers' ``PagedAttentionCache``, 5.17 layout or 5.23+ layout."""
    return hasattr(cache, "layer_to_allocator") or hasattr(cache, "layer_index_to_group_indices")


def kvonce_paged_attention(module, query, key, value, attention_mask=None, dropout: float = 0.0,
                           scaling: float | None = None, *, cache=None, **kwargs):
    """transformers attention function for continuous batching: ``query [1, H, T, D]``,
    ``key/value [1, Hk, Tk, D]`` -> ``(out [1, T, H, D], None)``.

    With a paged ``cache`` (the in-place path), ``key``/``value`` are the batch's new tokens
    (``Tk = T``), written here. Without one (the gathered fallback, see the module docstring),
    they are every sequence's past+new tokens, already in the cache, ``cu_seq_lens_k`` apart.
    """
    if dropout:
        raise ValueError(f"{NAME} has no dropout")
    if kwargs.get("block_table") is not None:
        raise NotImplementedError(f"{NAME}: transformers' decode fast path (block_table) is not "
                                  "supported; set max_blocks_per_request=0")
    if _is_paged_cache(cache):
        return _attend_in_place(module, query, key, value, scaling, cache, kwargs)
    if cache is None and "write_index" in kwargs and "cu_seq_lens_q" in kwargs:
        return _attend_gathered(module, query, key, value, scaling, kwargs)
    raise ValueError(f"{NAME} runs only under transformers' continuous batching "
                     "(model.generate_batch), which passes a PagedAttentionCache or the "
                     "cache's indices (write_index, cu_seq_lens_q)")


def _attend_in_place(module, query, key, value, scaling, cache, kwargs):
    """Write the new K/V into this layer's pages and read the pages where they lie."""
    group, layer_type, page_size, (k_tokens, v_tokens), (k_pages, v_pages) = \
        _layer_cache(cache, module.layer_idx)
    if getattr(module, "sliding_window", None) or layer_type != "full_attention":
        raise NotImplementedError(f"{NAME}: sliding-window layers are not supported")

    cu_k = _per_layer_type(kwargs["cu_seq_lens_k"], layer_type).to(torch.int32)
    max_k = _per_layer_type(kwargs.get("max_length_k", kwargs.get("max_seqlen_k")), layer_type)
    max_q = kwargs.get("max_length_q", kwargs.get("max_seqlen_q"))
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    read_index = kwargs["read_index"][group]
    write_index = kwargs["write_index"][group]

    # write the new tokens' K/V at their slots (flat token views of this layer)
    k_tokens.index_copy_(0, write_index, key[0].transpose(0, 1))
    v_tokens.index_copy_(0, write_index, value[0].transpose(0, 1))

    # no past KV in the batch: read_index is empty and write_index lists every token in order
    slots = read_index if read_index.numel() > 0 else write_index
    block_table = block_table_from_read_index(slots, cu_k, max_k, page_size)
    q = query[0].transpose(0, 1)  # [T, H, D] view, last dim contiguous
    out = paged_prefill(q, k_pages, v_pages, cu_q, cu_k[1:] - cu_k[:-1], block_table,
                        max_seqlen_q=int(max_q), softmax_scale=scaling, causal=True)
    return out.unsqueeze(0), None


def _attend_gathered(module, query, key, value, scaling, kwargs):
    """Varlen attention over the contiguous past+new K/V transformers gathered (>= 5.24)."""
    if getattr(module, "sliding_window", None):
        raise NotImplementedError(f"{NAME}: sliding-window layers are not supported")
    # cache.update narrowed these to the layer; a dict (not narrowed) is keyed by layer type
    cu_k = _per_layer_type(kwargs["cu_seq_lens_k"], "full_attention").to(torch.int32)
    max_k = _per_layer_type(kwargs["max_length_k"], "full_attention")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [tokens, heads, D] views
    # k, v may hold more rows than cu_k[-1] (a read size padded for CUDA graphs): never read
    out = flash_attn_varlen_func(q, k, v, kwargs["cu_seq_lens_q"].to(torch.int32), cu_k,
                                 int(kwargs["max_length_q"]), int(max_k), softmax_scale=scaling,
                                 causal=True)
    return out.unsqueeze(0), None


def _patch_cb_attn_switch() -> None:
    """transformers >= 5.23 refuses any name but paged|eager, sdpa and flash ones for continuous
    batching; let the kvonce names through unchanged (idempotent)."""
    try:
        from transformers.generation.continuous_batching.continuous_api import (
            ContinuousBatchingManager)
    except ImportError:  # no continuous batching
        return
    original = ContinuousBatchingManager.switch_to_cb_friendly_attn
    if getattr(original, "_kvonce_wrapped", False):
        return

    def switch_to_cb_friendly_attn(self, model, *args, **kwargs):
        if model.config._attn_implementation in NAMES:
            return None
        return original(self, model, *args, **kwargs)

    switch_to_cb_friendly_attn._kvonce_wrapped = True
    ContinuousBatchingManager.switch_to_cb_friendly_attn = switch_to_cb_friendly_attn


def _patch_paged_cache_update() -> None:
    """Give the kvonce names the cache instead of a gathered copy: transformers >= 5.24's models
    call ``cache.update(k, v, layer_idx, kwargs=kwargs)`` before the attention function, which
    then gets no cache (see the module docstring). Installed only where ``update`` takes the
    attention ``kwargs`` (5.23 on); idempotent; every other implementation gets the original."""
    try:
        from transformers.generation.continuous_batching.cache import PagedAttentionCache
    except ImportError:  # no continuous batching
        return
    original = PagedAttentionCache.update
    if getattr(original, "_kvonce_wrapped", False) \
            or "kwargs" not in inspect.signature(original).parameters:
        return

    # not functools.wraps: it would copy the original's torch.compiler.disable marks
    def update(self, key_states, value_states, layer_idx, kwargs, *args, **extra):
        if (isinstance(kwargs, dict) and "cache" not in kwargs
                and getattr(getattr(self, "config", None), "_attn_implementation", None) in NAMES):
            kwargs["cache"] = self  # kvonce writes the new K/V and reads the pages in place
            return key_states, value_states
        return original(self, key_states, value_states, layer_idx, kwargs, *args, **extra)

    update._kvonce_wrapped = True
    update._kvonce_original = original
    PagedAttentionCache.update = update


def register() -> None:
    """Register ``"paged|kvonce"`` (and ``"kvonce"``, what transformers >= 5.23 strips it to) and
    install the two patches of the module docstring."""
    from transformers import AttentionInterface

    for name in NAMES:
        AttentionInterface.register(name, kvonce_paged_attention)
    _patch_cb_attn_switch()
    _patch_paged_cache_update()
