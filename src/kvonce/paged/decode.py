"""Paged KV-cache decode: split choice, plan, allocation, launch; the decode custom ops.

``paged_attention`` runs the GQA-packed flash-decoding kernel (kernels/paged_decode.py) over a
paged cache in flash-attn's ``flash_attn_with_kvcache`` layout (plain or quantized); a
``PagedDecodePlan`` does its checks and split choice once for every layer of a step, and plans
the shared-prefix cascade (paged/prefix.py) where asked.

Nothing on the hot path reads tensor values on the host: the split count comes from shapes and the
SM count, sequence lengths are read by the kernel, so a call is CUDA-graph capturable.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from .. import _validate as V
from .._dispatch import like_inputs, use_op
from ..kernels.configs import (SHORT_SPLIT_KEYS, PagedDecodeConfig, device_info,
                               get_paged_decode_config)
from ..kernels._launch import dot_precision
from ..kernels.paged_decode import PagedDecodeLaunch, decode_row_blocks, head_pairs_eligible
from ._alloc import allocator
from .checks import (QUANT_FORMATS, check_block_table_values, check_device_ok, check_scales,
                     launch_layout, resolve_kv_format, validate_cache,
                     validate_quantized_cache)
from .prefix import plan_cascade
from .splits import (FALLBACK_MIN_KEYS, GLUON_MIN_KEYS, busy_splits, choose_num_splits,
                     gluon_batch_cut, gluon_int4_pays, gluon_num_splits,
                     one_wave_splits, is_one_wave, triton_batch_cut)

__all__ = ["paged_attention", "PagedDecodePlan", "choose_num_splits"]


def _validate_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                        kv_format: str) -> None:
    """The checks of ``_validate_attention`` for a quantized cache, plus its scales'."""
    V.check_tensor("q", q, ndim=4, dtypes=V.ATTN_DTYPES)
    validate_quantized_cache(k_cache, v_cache, cache_seqlens, block_table, kv_format)
    head_dim = q.shape[3]
    stored = head_dim // 2 if kv_format == "int4" else head_dim
    if k_cache.shape[3] != stored or (kv_format == "int4" and head_dim % 32 != 0):
        raise ValueError(f"k_cache's last dim must be {stored} for q's head dim {head_dim} "
                         f"({kv_format}), got {k_cache.shape[3]}")
    V.check_head_dim("q", head_dim)
    if q.shape[0] != block_table.shape[0]:
        raise ValueError(f"q, cache_seqlens and block_table must share the batch: "
                         f"{q.shape[0]}, {cache_seqlens.shape[0]}, {block_table.shape[0]}")
    if q.shape[1] < 1:
        raise ValueError(f"q must have q_len >= 1 (dim 1), got shape {tuple(q.shape)}")
    V.check_gqa(q.shape[2], k_cache.shape[2])
    V.check_last_dim_contiguous(q=q)
    check_scales(k_scale, v_scale, kv_format, k_cache.shape, head_dim)
    V.check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        block_table=block_table, k_scale=k_scale, v_scale=v_scale)
    check_device_ok(q.device)


def _validate_attention(q, k_cache, v_cache, cache_seqlens, block_table, num_splits) -> None:
    V.check_tensor("q", q, ndim=4, dtypes=V.ATTN_DTYPES)
    validate_cache(k_cache, v_cache, cache_seqlens, block_table)
    V.check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        block_table=block_table)
    V.check_same_dtype(k_cache=k_cache, q=q)
    if q.shape[0] != block_table.shape[0]:
        raise ValueError(f"q has batch {q.shape[0]} but block_table has "
                         f"{block_table.shape[0]} rows")
    if q.shape[1] < 1:
        raise ValueError(f"q must have q_len >= 1 (dim 1), got shape {tuple(q.shape)}")
    if q.shape[3] != k_cache.shape[3]:
        raise ValueError(f"head dim mismatch: q has {q.shape[3]}, k_cache has {k_cache.shape[3]}")
    V.check_gqa(q.shape[2], k_cache.shape[2])
    V.check_last_dim_contiguous(q=q)
    V.check_nonnegative_int("num_splits", num_splits)
    check_device_ok(q.device)


# The head-pair row's launch must fill its waves: at 2 programs an SM, a pair launch whose
# waves run under this share of its slots on average loses to the one-head row's 3 programs an
# SM (MHA 12/12 16 x 4096 and 32 x 8192: 0.73, 8-27% slower; every winning row 0.91-1.0;
# 2026-11-27, tenth session, docs/notes.md).
PAIR_WAVE_FILL = 0.85
# The row's ``wide_block_n`` tile (128 keys on the plain d128 row) where its waves of
# WIDE_TILE_PROGRAMS_PER_SM programs an SM fill: one wave, or a single pass whose last wave is at
# least WIDE_TILE_WAVE_FILL full on average (splits of at least FALLBACK_MIN_KEYS keys). Three an
# SM is what the measured losses fit (they sit between 1.1 and 1.5 such waves); compiled for
# sm_90a (fp16 q, int32 offsets) the 128-key loop holds 175 registers and 72 KB of shared memory
# (two programs an SM by registers, three by shared memory), the 64-key loop 80 and 38 KB
# (five): the occupancy the GPU reaches is ncu's to confirm. H200, graphs, fp16 q, 2026-11-29 fifteenth session (docs/notes.md),
# 128 against 64 keys: won 0.925-0.998 at up to 3 programs an SM (32/8 40 x 2048 -7.5%, 8 x 8192
# -3.6%, 1 x 131072 -2.4%; 12/12 32 x 2048, 8 x 8192, 16 x 4096, 2 x 32768 -1.7 to -2.8%) and at
# 4.8, 5.8, 7.8, 11.6 (-0.2 to -3.1%); lost between 3 and 4.4 programs an SM, where 64-key tiles
# still run one wave and 128-key ones a ragged second (32/8 56 x 2048 +21%, 64 x 2048 +11%,
# 72 x 2048 +1.7%; 12/12 40 x 2048 +18%, 43 x 2048 +11%, 48 x 2048 +2.3%). On the H100 (twelfth
# session) launches of 2.8 programs an SM lost 3% with 128-key tiles (12/2 1 x 131072) that win
# 2% on the H200: the rule is the H200's.
WIDE_TILE_PROGRAMS_PER_SM = 3
WIDE_TILE_WAVE_FILL = 0.8


def _default_config(capability, num_sms, q, k_cache, block_table, kv_format,
                    kv_code) -> PagedDecodeConfig:
    """The config row for this call's GPU, head dim, query dtype and format. Token-major pages
    (a key's KV heads adjacent: ``k_cache.stride(2)`` is one head's row) take the format's
    token-major row where its head pairs can run (``head_pairs_eligible``) and their launch
    fills its waves (``PAIR_WAVE_FILL``, counted as ``choose_num_splits`` counts programs), else
    the general one; int4 on sm_90 with ``gluon`` turned on where the Gluon decode pays
    (``gluon_int4_pays``: the rows keep it off, so that a caller's row runs Triton)."""
    head_dim, nheads_k = q.shape[-1], k_cache.shape[2]
    row = functools.partial(get_paged_decode_config, capability, head_dim, kv_format,
                            q.element_size(), bf16=q.dtype == torch.bfloat16)
    config = row(token_major=kv_format is not None and k_cache.stride(2) == k_cache.shape[3])
    if config.head_pairs and not head_pairs_eligible(config, kv_code, q.dtype, head_dim,
                                                     nheads_k):
        config = row()
    elif config.head_pairs:
        batch, pairs = q.shape[0], nheads_k // 2
        splits = choose_num_splits(batch, pairs, block_table.shape[1] * k_cache.shape[1],
                                   num_sms, config)
        waves = max(1, batch * pairs * splits) / (config.programs_per_sm * num_sms)
        if waves / math.ceil(waves) < PAIR_WAVE_FILL:
            config = row()
    # int4 on sm_90 takes the Gluon decode where it measured faster (``gluon_int4_pays``)
    rows = q.shape[1] * (q.shape[2] // max(1, nheads_k))
    if (kv_format == "int4" and capability == (9, 0)
            and gluon_int4_pays(q.shape[0] * nheads_k, rows, num_sms)):
        config = dataclasses.replace(config, gluon=True)
    return config


def _gluon_fits(q, k_cache, v_cache, kv_format: int, outlier_values=None, k_scale=None,
                v_scale=None) -> bool:
    """Whether the Gluon decode (``PagedDecodeConfig.gluon``) can run this launch: an sm_90
    device and ``kernels.gluon_decode.paged_fits`` (imported only there)."""
    if device_info(q.device)[0] != (9, 0):   # (None, 1) off CUDA
        return False
    from ..kernels.gluon_decode import paged_fits
    return paged_fits(q, k_cache, v_cache, kv_format, outlier_values, k_scale, v_scale)


def _gluon_head_group(q, k_cache, kv_format: int, k_scale=None, v_scale=None) -> int:
    """KV heads a CTA of the Gluon decode takes (``kernels.gluon_decode.kv_head_group``)."""
    from ..kernels.gluon_decode import kv_head_group
    return kv_head_group(q, k_cache, kv_format, k_scale, v_scale)


def _gluon_writes_partials(num_splits: int) -> bool:
    """Whether a Gluon decode launch of ``num_splits`` splits needs the split scratch."""
    from ..kernels.gluon_decode import writes_partials
    return writes_partials(num_splits)


def _decode_launch(q, k_cache, v_cache, block_table, *, softmax_scale: float, causal: bool,
                   num_splits: int, config: PagedDecodeConfig, store_lse: bool,
                   kv_format: int = 0, k_scale=None, v_scale=None, outlier_values=None,
                   gluon_ok: bool = False, batch_cut: int = 0, pdl_pair: str = ""):
    """The launch of one decode shape: the Gluon decode where the config asks for it, the caller
    allows it (``gluon_ok``: the plan's choice; a custom op's where it has the scratch the Gluon
    launch needs) and the tensors fit (``_gluon_fits``), else ``PagedDecodeLaunch``; both are
    called alike. ``batch_cut`` > 0: sequences ``[0, batch_cut)`` in one pass, the rest at
    ``num_splits`` splits, two launches (``batch_cut.BatchCutLaunch``), the second a
    programmatic dependent of the first on Hopper (``batch_cut.overlaps``; ``pdl_pair`` "head" /
    "tail": the part this launch is)."""
    if 0 < batch_cut < q.shape[0]:
        from .batch_cut import BatchCutLaunch, overlaps

        def part(rows, splits, pair=""):
            return _decode_launch(q[rows], k_cache, v_cache, block_table[rows],
                                  softmax_scale=softmax_scale, causal=causal, num_splits=splits,
                                  config=config, store_lse=store_lse, kv_format=kv_format,
                                  k_scale=k_scale, v_scale=v_scale,
                                  outlier_values=outlier_values, gluon_ok=gluon_ok,
                                  pdl_pair=pair)

        head = part(slice(0, batch_cut), 1)
        tail = part(slice(batch_cut, None), num_splits)
        if overlaps(head, tail, q.device):
            head = part(slice(0, batch_cut), 1, "head")
            tail = part(slice(batch_cut, None), num_splits, "tail")
        return BatchCutLaunch(head, tail, batch_cut)
    if config.gluon and gluon_ok and _gluon_fits(q, k_cache, v_cache, kv_format, outlier_values,
                                                 k_scale, v_scale):
        from ..kernels.gluon_decode import PagedGluonDecodeLaunch
        return PagedGluonDecodeLaunch(q, k_cache, v_cache, block_table,
                                      softmax_scale=softmax_scale, causal=causal,
                                      num_splits=num_splits, store_lse=store_lse,
                                      kv_format=kv_format, k_scale=k_scale, v_scale=v_scale,
                                      trigger_next=pdl_pair == "head",
                                      follows=pdl_pair == "tail")
    return PagedDecodeLaunch(q, k_cache, v_cache, block_table, softmax_scale=softmax_scale,
                             causal=causal, num_splits=num_splits, config=config,
                             store_lse=store_lse, kv_format=kv_format, k_scale=k_scale,
                             v_scale=v_scale, outlier_values=outlier_values,
                             trigger_next=pdl_pair == "head", follows=pdl_pair == "tail")


def _launch_shape_config(config: PagedDecodeConfig, base: int, num_splits: int,
                         max_keys: int, num_sms: int, mha: bool = False,
                         group: int = 0) -> PagedDecodeConfig:
    """The row's tile, page-id and offset choices for the launch the auto split count made:
    ``base`` programs a split, ``num_splits`` splits of a ``max_keys``-key sequence, ``mha``
    where each KV head serves one q head, ``group`` q heads a KV head for one new token whose
    rows fit one 16-row M-block, else 0 (``PagedDecodeConfig.one_pass_prefetch``,
    ``wide_block_n``, ``wide_merge_at_once``, ``one_wave``)."""
    if group and is_one_wave(base, num_splits, max_keys, num_sms, config):
        # one program an SM, two 128-key tiles in flight (``one_wave_splits``)
        block_n, num_stages = config.one_wave
        return dataclasses.replace(config, block_n=block_n, num_stages=num_stages,
                                   prefetch_pages=True)
    lo, hi = config.one_pass_programs_per_sm
    if (config.one_pass_prefetch and num_splits == 1
            and lo * num_sms <= base < hi * num_sms):
        # MHA's one pass with carried page ids keeps int64 offsets: int32 there was 4-12%
        # slower (12/12 64 x 1024, 56 x 2048, 64 x 8192; H200, 2026-11-29) where every
        # other plain d128 launch measured gained 0-5% (GQA 32/8 88 x 2048 in the band: -2.9%).
        config = dataclasses.replace(config, prefetch_pages=True,
                                     int64_kv_offsets=config.int64_kv_offsets or mha)
    if (config.wide_block_n and -(-max_keys // num_splits) >= FALLBACK_MIN_KEYS
            and _wide_tile_fills(base, num_splits, num_sms)):
        config = dataclasses.replace(config, block_n=config.wide_block_n)
        # the group's partials at once where its register count decides the waves: more than
        # two programs an SM (at two or fewer, 4 at once only adds instructions: GQA 12/2
        # 64 x 1024, 256 programs, +0.6-0.9%, H200)
        at_once = dict(config.wide_merge_at_once).get(group)
        if (at_once and 1 < num_splits <= config.max_merged_splits
                and base * num_splits > (WIDE_TILE_PROGRAMS_PER_SM - 1) * num_sms):
            config = dataclasses.replace(config, merge_splits_at_once=at_once)
    return config


def _wide_tile_fills(base: int, num_splits: int, num_sms: int) -> bool:
    """Whether ``base * num_splits`` programs run as full waves of ``wide_block_n`` programs
    (WIDE_TILE_PROGRAMS_PER_SM an SM): one wave, or a single pass whose last wave is at least
    WIDE_TILE_WAVE_FILL full. The slow band's split launches (several waves of short splits)
    keep the row's tile: 12/12 70 x 2048 even, 32/8 104 x 8192 1.3% faster at 64 keys (H200)."""
    waves = base * num_splits / (WIDE_TILE_PROGRAMS_PER_SM * num_sms)
    return waves <= 1 or (num_splits == 1 and waves / math.ceil(waves) >= WIDE_TILE_WAVE_FILL)


class PagedDecodePlan:
    """Split count, launch config and split-K scratch for one decode step, reused by every layer.

    ``PagedDecodePlan(q, k_cache, v_cache, cache_seqlens, block_table, ...)`` validates the
    example tensors fully (arguments as in ``paged_attention``) and sizes everything from their
    shapes. ``run(...)`` then takes tensors of the same shapes, dtype and device (per layer, per
    step: values may change freely), checks only that cheaply, and launches: no host sync, no
    per-call validation cost, CUDA-graph capturable. The scratch is reused by every ``run``, so
    one plan serves one stream.

    Eager ``run`` launches the kernels directly through Triton's C launcher (the launch is bound
    once per stride layout: ``kernels/_launch.py``); under ``torch.compile``, a dispatch or
    function mode, or with fake/meta/subclass tensors (``kvonce._dispatch.use_op``) it calls the
    ``torch.ops.kvonce.paged_decode`` / ``paged_decode_split`` custom ops, which run the same
    kernels (the op dispatch costs ~16 us of host time per call, docs/notes.md). A plan made from
    real tensors also runs fake ones of the same shapes (its scratch is converted to the inputs'
    fake mode); meta inputs need a plan made from meta tensors.

    ``shared_prefix="auto"`` (the tree read from the block table on the host, here) or
    ``[(seq_ids, num_pages), ...]`` plans the shared-prefix cascade (``kvonce.paged.prefix``; plain
    fp16/bf16/fp32 caches) where ``cascade`` ("auto": a cost model; True / False) says so;
    ``uses_cascade`` tells which; ``run`` returns the same either way.

    ``num_splits`` and ``batch_cut`` say how the keys are cut: ``batch_cut`` > 0 runs sequences
    ``[0, batch_cut)`` in one pass and the rest at ``num_splits`` splits, two launches
    (``kvonce.paged.batch_cut``; the Gluon decode's rule ``splits.gluon_batch_cut``, off by
    default); 0 runs every sequence at ``num_splits``.

    fp32 queries: the dots follow PyTorch's float32 matmul precision as it is when the plan is
    built (IEEE fp32 under the default "highest", TF32 under "high"/"medium"); eager ``run`` keeps
    that choice (the custom ops read the setting per call).
    """

    def __init__(self, q, k_cache, v_cache, cache_seqlens, block_table, *,
                 softmax_scale: float | None = None, causal: bool = True, num_splits: int = 0,
                 check_block_table: bool = False, config: PagedDecodeConfig | None = None,
                 kv_format: str | None = None, k_scale=None, v_scale=None,
                 shared_prefix=None, cascade="auto", _scratch_per_call: bool = False):
        self.kv_format = resolve_kv_format(k_cache, kv_format)
        if shared_prefix is not None and self.kv_format is not None:
            raise NotImplementedError("shared_prefix with a quantized cache: not yet")
        if self.kv_format is None:
            if k_scale is not None or v_scale is not None:
                raise ValueError("k_scale/v_scale are for quantized caches (fp8/int8/int4)")
            _validate_attention(q, k_cache, v_cache, cache_seqlens, block_table, num_splits)
        else:
            _validate_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                                self.kv_format)
            V.check_nonnegative_int("num_splits", num_splits)
        self._kv_code = 0 if self.kv_format is None else QUANT_FORMATS[self.kv_format][0]
        self._kv_dtype = k_cache.dtype
        page_size = k_cache.shape[1]
        if check_block_table:
            check_block_table_values(cache_seqlens, block_table, k_cache.shape[0], page_size)
        batch, q_len, nheads, head_dim = q.shape
        capability, num_sms = device_info(q.device)
        own_config = config is None
        self.config = config or _default_config(capability, num_sms, q, k_cache, block_table,
                                                self.kv_format, self._kv_code)
        # Shared-prefix cascade (kvonce.paged.prefix): None unless asked for and paying; a forced
        # num_splits applies to its suffix decode.
        self._cascade = None
        if shared_prefix is not None:
            self._cascade = plan_cascade(self, q, k_cache, v_cache, cache_seqlens, block_table,
                                         shared_prefix, cascade=cascade, num_splits=num_splits,
                                         check=check_block_table)
        self.uses_cascade = self._cascade is not None
        # The Gluon decode (config.gluon) where the example tensors fit it; its own splits.
        max_keys = block_table.shape[1] * page_size
        self.uses_gluon = (self.config.gluon and max_keys >= GLUON_MIN_KEYS
                           and _gluon_fits(q, k_cache, v_cache, self._kv_code, None, k_scale,
                                           v_scale))
        if self.config.gluon and not self.uses_gluon:
            self.config = dataclasses.replace(self.config, gluon=False)
        # int4 head pairs (config.head_pairs): a program serves two KV heads
        grid_heads = k_cache.shape[2] // (2 if head_pairs_eligible(
            self.config, self._kv_code, q.dtype, head_dim, k_cache.shape[2]) else 1)
        # batch_cut > 0: sequences [0, batch_cut) in one pass, the rest at num_splits splits
        self.batch_cut = 0
        if num_splits == 0 and self.uses_gluon:   # CTAs a split: one a KV head group's
            heads = _gluon_head_group(q, k_cache, self._kv_code, k_scale, v_scale)
            two_ctas = self.kv_format == "int4"
            self.batch_cut, num_splits = gluon_batch_cut(
                batch, k_cache.shape[2] // heads, max_keys, num_sms, two_ctas, 128 // heads)
            if not self.batch_cut:
                num_splits = gluon_num_splits(batch * k_cache.shape[2] // heads, max_keys,
                                              num_sms, two_ctas_an_sm=two_ctas,
                                              tile_keys=128 // heads)
        elif num_splits == 0 or (own_config and not self.uses_gluon):
            forced = num_splits > 0
            # a one pass of the row's own launch whose last wave is ragged: cut (both parts at
            # the row's config; its resident programs counted at one 16-row M-block)
            rows16 = decode_row_blocks(nheads, grid_heads, q.shape[1], self._kv_code) == (16, 1)
            one_block_group = nheads // grid_heads if rows16 and q.shape[1] == 1 else 0
            if not forced:
                num_splits = (one_block_group and one_wave_splits(
                    batch * grid_heads, max_keys, num_sms, self.config)) or choose_num_splits(
                        batch, grid_heads, max_keys, num_sms, self.config)
            # A split count the caller forces takes the tile the rule's launch takes at that
            # count (with the plan's own config; a caller's config stays as given): forced 2
            # splits at GQA 12/2 64 x 1024, the rule's own count, ran the row's 64-key tile in
            # 25.4 us against the rule's 128-key 22.6, 48 x 1024 21.4 against 16.7 (H200,
            # 2026-12-01, forty-fourth session). It keeps its count: no batch cut, no split
            # dropped.
            shaped = _launch_shape_config(self.config, batch * grid_heads, num_splits,
                                          max_keys, num_sms, mha=nheads == k_cache.shape[2],
                                          group=one_block_group)
            cut = (triton_batch_cut(batch, grid_heads, max_keys, num_sms, self.config)
                   if num_splits == 1 and shaped == self.config and rows16 and not forced
                   else (0, 0))
            if cut[0]:
                self.batch_cut, num_splits = cut
            else:
                self.config = shaped
                if not forced:
                    # a longer tile than the count was cut for can leave its last splits empty
                    num_splits = busy_splits(max_keys, num_splits, self.config.block_n)
        self.num_splits = num_splits
        # The Gluon decode's partials: split launches, and one split unless it stores out itself
        self._gluon_partials = self.uses_gluon and _gluon_writes_partials(num_splits)
        split_keys = -(-max_keys // num_splits)
        if self.config.short_split_block_n and num_splits > 1 and split_keys < SHORT_SPLIT_KEYS:
            self.config = dataclasses.replace(self.config, block_n=self.config.short_split_block_n)
        if self.config.mha_num_stages and nheads == k_cache.shape[2]:
            self.config = dataclasses.replace(self.config, num_stages=self.config.mha_num_stages)
        self.causal = causal
        self.softmax_scale = head_dim ** -0.5 if softmax_scale is None else float(softmax_scale)
        self._q_shape, self._kv_tail = q.shape, k_cache.shape[1:]
        self._dtype, self._device, self._batch = q.dtype, q.device, batch
        self._nheads_k = k_cache.shape[2]
        self._scratch_per_call = _scratch_per_call
        self._split_scratch = (None, None, None)
        if (num_splits > 1 or self._gluon_partials) and not _scratch_per_call:
            self._split_scratch = self._new_scratch()
        # Launches bound to one stride layout, made at the first eager run (never while
        # torch.compile traces): (strides of q, k_cache, v_cache, block_table, return_lse) ->
        # PagedDecodeLaunch.
        self._launches: dict = {}

    def _check_like_plan(self, q, k_cache, v_cache, cache_seqlens, block_table) -> None:
        if (q.shape != self._q_shape or k_cache.shape[1:] != self._kv_tail
                or v_cache.shape != k_cache.shape or q.dtype != self._dtype
                or k_cache.dtype != self._kv_dtype or v_cache.dtype != self._kv_dtype
                or q.device != self._device or block_table.shape[0] != self._batch
                or cache_seqlens.shape != (self._batch,) or q.stride(-1) != 1
                or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1
                or (block_table.numel() > 0 and block_table.stride(1) != 1)):
            raise ValueError(
                f"PagedDecodePlan.run: inputs differ from the plan (q {tuple(q.shape)} "
                f"{q.dtype} on {q.device}, k_cache {tuple(k_cache.shape)}; planned q "
                f"{tuple(self._q_shape)} {self._dtype} on {self._device}, k_cache [*, "
                f"{', '.join(map(str, self._kv_tail))}], unit last-dim strides): make a new plan")

    def run(self, q, k_cache, v_cache, cache_seqlens, block_table, *, k_scale=None, v_scale=None,
            return_lse: bool = False, key_transform=None, key_outliers=None):
        """Attention for tensors shaped like the planned ones; returns like ``paged_attention``.
        A quantized cache takes this layer's ``k_scale``/``v_scale`` (shapes as planned), and
        ``key_transform`` or ``key_outliers`` where its keys were stored through one
        (``paged_attention``)."""
        if key_outliers is not None:
            if key_transform is not None:
                raise ValueError("key_outliers and key_transform: use one")
            if self.kv_format is None:
                raise ValueError("key_outliers is for quantized caches (fp8/int8/int4): a 16-bit "
                                 "cache keeps every channel already")
            if self.config.swap_ab:
                raise ValueError("key_outliers: not with PagedDecodeConfig.swap_ab")
            return self._run_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                                       v_scale, return_lse, key_outliers)
        if key_transform is None:
            return self._run(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                             return_lse)
        out = self._run(key_transform.queries(q), k_cache, v_cache, cache_seqlens, block_table,
                        k_scale, v_scale, return_lse)
        if not return_lse:
            return out
        out, lse = out
        # q' . k' = q . k - q . c: the same shift for every key of a row ([b, q_len, h] -> the
        # LSE's [b, h, q_len]); -inf rows stay -inf.
        return out, lse + key_transform.lse_offset(q, self.softmax_scale).transpose(1, 2)

    def _run(self, q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
             return_lse):
        if self._cascade is not None:
            return self._cascade.run(q, k_cache, v_cache, cache_seqlens, block_table,
                                     return_lse=return_lse)
        if self._kv_code:
            return self._run_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                                       v_scale, return_lse)
        if use_op(q, k_cache, v_cache, cache_seqlens, block_table):
            self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
            out, lse = self._run_op(q, k_cache, v_cache, cache_seqlens, block_table)
            return (out, lse) if return_lse else out
        layout = (q.stride(), k_cache.stride(), v_cache.stride(), block_table.stride(), return_lse)
        launch = self._launches.get(layout)
        if launch is None or q.shape != self._q_shape or k_cache.dtype is not self._kv_dtype:
            launch = self._bind(q, k_cache, v_cache, cache_seqlens, block_table, layout)
        elif (k_cache.shape[1:] != self._kv_tail or v_cache.shape != k_cache.shape
              or q.dtype is not self._dtype or v_cache.dtype is not self._dtype
              or block_table.shape[0] != self._batch or cache_seqlens.shape[0] != self._batch
              or q.device != self._device):
            self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)  # raises
        out = allocator.empty(self._q_shape, dtype=self._dtype, device=self._device)
        lse = None
        if return_lse:
            batch, q_len, nheads, _ = self._q_shape
            lse = allocator.empty((batch, nheads, q_len), dtype=torch.float32, device=self._device)
        launch(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, *self._scratch())
        return (out, lse) if return_lse else out

    def _run_quantized(self, q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                       return_lse, key_outliers=None):
        """Eager quantized decode: full checks on the first call of a stride layout (scales
        and outlier channels included), then launches only."""
        ko = key_outliers
        values, channels = (None, None) if ko is None else (ko.values, ko.channels)
        if use_op(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, values,
                  channels):
            _validate_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                                self.kv_format)
            if ko is not None:
                ko.check_for(q, k_cache, self.kv_format)
            self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
            out, lse = self._run_op(q, k_cache, v_cache, cache_seqlens, block_table, k_scale,
                                    v_scale, values, channels)
            return (out, lse) if return_lse else out
        layout = launch_layout(q, k_cache, v_cache, block_table, return_lse, k_scale, v_scale,
                               values, channels)
        launch = self._launches.get(layout)
        if (launch is None or q.shape != self._q_shape or k_cache.shape[1:] != self._kv_tail
                or k_cache.dtype is not self._kv_dtype or q.dtype is not self._dtype
                or (ko is not None and (values.shape[:3] != k_cache.shape[:3]
                                        or ko.max_channel >= q.shape[-1]
                                        or values.device != q.device
                                        or channels.device != q.device))):
            _validate_quantized(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                                self.kv_format)
            if ko is not None:
                ko.check_for(q, k_cache, self.kv_format)
            self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
            launch = _decode_launch(q, k_cache, v_cache, block_table,
                                    softmax_scale=self.softmax_scale, causal=self.causal,
                                    num_splits=self.num_splits, config=self.config,
                                    store_lse=return_lse, kv_format=self._kv_code,
                                    k_scale=k_scale, v_scale=v_scale, outlier_values=values,
                                    gluon_ok=self.uses_gluon, batch_cut=self.batch_cut)
            self._launches[layout] = launch
        out = allocator.empty(self._q_shape, dtype=self._dtype, device=self._device)
        lse = None
        if return_lse:
            batch, q_len, nheads, _ = self._q_shape
            lse = allocator.empty((batch, nheads, q_len), dtype=torch.float32, device=self._device)
        launch(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, *self._scratch(),
               k_scale, v_scale, values, channels)
        return (out, lse) if return_lse else out

    def _scratch(self):
        """Split-K partials and arrival counts: the plan's own, or fresh ones for the plans of
        one-shot calls (which may run on several streams at once)."""
        if not self._scratch_per_call or (self.num_splits == 1 and not self._gluon_partials):
            return self._split_scratch
        return self._new_scratch()

    def _new_scratch(self):
        batch, q_len, nheads, head_dim = self._q_shape
        s = self.num_splits
        # One arrival count a (sequence, KV head, M-block); int4 head pairs index fewer: half
        # the heads, at most twice the M-blocks (config.head_pairs).
        m_blocks = decode_row_blocks(nheads, self._nheads_k, q_len, self._kv_code)[1]
        arrivals = torch.zeros((batch, self._nheads_k, m_blocks), dtype=torch.int32,
                               device=self._device)
        return (allocator.empty((batch, q_len, nheads, s, head_dim), dtype=torch.float32,
                                device=self._device),
                allocator.empty((batch, q_len, nheads, s), dtype=torch.float32,
                                device=self._device),
                arrivals)

    def _bind(self, q, k_cache, v_cache, cache_seqlens, block_table, layout):
        """Full check, then the launch for this stride layout (kept for later runs)."""
        self._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
        launch = _decode_launch(q, k_cache, v_cache, block_table,
                                softmax_scale=self.softmax_scale, causal=self.causal,
                                num_splits=self.num_splits, config=self.config,
                                store_lse=layout[-1], batch_cut=self.batch_cut)
        self._launches[layout] = launch
        return launch

    def _run_op(self, q, k_cache, v_cache, cache_seqlens, block_table, k_scale=None,
                v_scale=None, outlier_values=None, outlier_channels=None):
        c = self.config
        max_registers = c.max_registers  # the launch's own choice (PagedDecodeLaunch)
        if outlier_values is not None and c.outlier_max_registers:
            max_registers = c.outlier_max_registers
        launch_fields = (self.softmax_scale, self.causal, c.block_n, c.num_warps, c.num_stages,
                         c.kv_cache_modifier, c.kv_eviction, c.max_merged_splits, k_scale,
                         v_scale, self._kv_code, max_registers, c.swap_ab, c.f16_math,
                         c.int64_kv_offsets, c.v_pairs, outlier_values, outlier_channels,
                         c.prefetch_pages, c.head_pairs, c.gluon, self.batch_cut,
                         c.merge_splits_at_once)
        if self.num_splits == 1 and not self._gluon_partials:
            return torch.ops.kvonce.paged_decode(q, k_cache, v_cache, cache_seqlens, block_table,
                                                 *launch_fields)
        return torch.ops.kvonce.paged_decode_split(q, k_cache, v_cache, cache_seqlens,
                                                   block_table, *like_inputs(q, *self._scratch()),
                                                   *launch_fields)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    num_splits: int = 0,
    return_lse: bool = False,
    check_block_table: bool = False,
    config: PagedDecodeConfig | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    kv_format: str | None = None,
    key_transform=None,
    key_outliers=None,
):
    """Attention of the newest ``q_len`` tokens of each sequence over its paged KV cache.

    Parameters
    ----------
    q : ``[batch, q_len, nheads, headdim]`` fp16/bf16, or fp32
        (computed in fp32: IEEE dots under PyTorch's default matmul precision, TF32 only when
        the user allows it), last dim contiguous.
    k_cache, v_cache : ``[num_pages, page_size, nheads_k, headdim]``, ``page_size`` a power of two
        in 16..256, ``nheads % nheads_k == 0`` (GQA: q head ``h`` reads KV head
        ``h // (nheads // nheads_k)``).
    cache_seqlens : int32 ``[batch]``: sequence ``b`` has ``cache_seqlens[b]`` keys, the new
        tokens' included; position ``p`` is
        ``cache[block_table[b, p // page_size], p % page_size]``.
    block_table : int32 ``[batch, max_pages]``; pages in any order.
    softmax_scale : defaults to ``headdim ** -0.5``.
    causal : bottom-right: with ``L = cache_seqlens[b]``, row ``t`` sees key
        ``j <= t + L - q_len``::

            q_len=2, L=5:  1 1 1 1 0
                           1 1 1 1 1

    num_splits : 0 picks the split-K count from shapes and the SM count (never from tensor values:
        the call is CUDA-graph capturable); a positive value forces it (1 = single pass), with
        the tile the automatic choice would launch at that count (unless ``config`` is given).
    return_lse : also return the LSE.
    check_block_table : validation mode, off by default: checks that every sequence's pages are in
        the table and name existing pages. It reads tensor values (a host sync; not capturable).
    config : launch-config override for experiments (kernels/configs.py).
    k_scale, v_scale, kv_format : a quantized cache (``kvonce.paged.quant`` layouts, dequantized in
        registers): fp8 e4m3 and int8 caches are recognised from their dtype, a uint8 cache needs
        ``kv_format="int4"``; scales as ``quantize_kv`` returns them.
    key_transform : a ``kvonce.paged.KeyTransform`` the cache's keys were stored through
        (``append_paged_kv(..., key_transform=)``: keys with outlier channels). ``q`` is
        transformed to match (``(q * s) @ H`` in q's dtype, two small PyTorch ops per call) and
        the LSE corrected by ``softmax_scale * q . c``; the output is that of the original keys.
    key_outliers : a ``kvonce.paged.KeyOutliers`` (quantized caches): the keys' outlier channels
        kept at q's precision in its side cache (``append_paged_kv(..., key_outliers=)``); each
        score adds ``q[channels] . values`` to the quantized keys' part. Not with
        ``key_transform``.

    Returns
    -------
    out : ``[batch, q_len, nheads, headdim]``, q's dtype.
    lse : float32 ``[batch, nheads, q_len]``, natural log (only with ``return_lse``; flash-attn's
        ``softmax_lse`` layout). A row that sees no key gets ``out = 0``, ``lse = -inf``.

    For many layers of one step, ``PagedDecodePlan`` does the checks and the split choice once.
    """
    signature = None
    if not (check_block_table or torch.compiler.is_compiling()):
        signature = V.call_signature(q, k_cache, v_cache, cache_seqlens, block_table,
                                     softmax_scale, causal, num_splits, config, k_scale, v_scale,
                                     kv_format, dot_precision(getattr(q, "dtype", None)))
    plan = _one_shot_plans.get(signature)
    if plan is None:
        plan = PagedDecodePlan(q, k_cache, v_cache, cache_seqlens, block_table,
                               softmax_scale=softmax_scale, causal=causal, num_splits=num_splits,
                               check_block_table=check_block_table, config=config,
                               kv_format=kv_format, k_scale=k_scale, v_scale=v_scale,
                               _scratch_per_call=True)
        _one_shot_plans.add(signature, plan)
    if plan.kv_format is not None:
        return plan.run(q, k_cache, v_cache, cache_seqlens, block_table, k_scale=k_scale,
                        v_scale=v_scale, return_lse=return_lse, key_transform=key_transform,
                        key_outliers=key_outliers)
    return plan.run(q, k_cache, v_cache, cache_seqlens, block_table, return_lse=return_lse,
                    key_transform=key_transform, key_outliers=key_outliers)


# One-shot calls reuse the plan of an earlier call with the same signature: everything the checks
# and the split choice read (shapes, strides, dtypes, devices, scalars), never tensor values. A
# hit has passed the checks before, so it skips them (host time: docs/notes.md). These plans own
# no scratch (split-K partials are allocated per call), so calls on different streams never
# share a buffer.
_one_shot_plans = V.PassedChecks()


# ------------------------------------------------------------------------------------------------
# torch.library custom ops: what torch.compile records, opaque to Inductor (which would otherwise
# re-compile our Triton code and fail), with fake implementations giving shapes and dtypes only.
# The public functions above check their arguments and call these ops where _dispatch.use_op says
# (compiling, a dispatch or function mode active, fake/meta/subclass tensors); plain eager calls
# run the same implementations without the op dispatch (~16 us of host time per call). FLOP
# formulas for FlopCounterMode: kvonce/flops.py.
# ------------------------------------------------------------------------------------------------

def _decode_outputs(q: torch.Tensor, alloc) -> tuple[torch.Tensor, torch.Tensor]:
    batch, q_len, nheads, _ = q.shape
    return (alloc(q.shape, dtype=q.dtype, device=q.device),
            alloc((batch, nheads, q_len), dtype=torch.float32, device=q.device))


def _paged_decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, o_part, lse_part,
                       arrivals, softmax_scale, causal, block_n, num_warps, num_stages,
                       kv_cache_modifier, kv_eviction, max_merged_splits, k_scale, v_scale,
                       kv_format, max_registers, swap_ab, f16_math, int64_kv_offsets,
                       v_pairs, outlier_values=None, outlier_channels=None,
                       prefetch_pages=False, head_pairs=False, gluon=False, batch_cut=0,
                       merge_splits_at_once=1):
    config = PagedDecodeConfig(block_n, num_warps, num_stages, kv_cache_modifier=kv_cache_modifier,
                               kv_eviction=kv_eviction, max_merged_splits=max_merged_splits,
                               max_registers=max_registers, swap_ab=swap_ab, f16_math=f16_math,
                               int64_kv_offsets=int64_kv_offsets, v_pairs=v_pairs,
                               prefetch_pages=prefetch_pages, head_pairs=head_pairs, gluon=gluon,
                               merge_splits_at_once=merge_splits_at_once)
    out, lse = _decode_outputs(q, allocator.empty)
    num_splits = 1 if o_part is None else o_part.shape[3]
    _decode_launch(q, k_cache, v_cache, block_table, softmax_scale=softmax_scale, causal=causal,
                   num_splits=num_splits, config=config, store_lse=True, kv_format=kv_format,
                   k_scale=k_scale, v_scale=v_scale, outlier_values=outlier_values,
                   gluon_ok=gluon and (o_part is not None
                                       or not _gluon_writes_partials(num_splits)),
                   batch_cut=batch_cut)(
        q, k_cache, v_cache, cache_seqlens, block_table, out, lse, o_part, lse_part, arrivals,
        k_scale, v_scale, outlier_values, outlier_channels)
    return out, lse


@torch.library.custom_op("kvonce::paged_decode", mutates_args=())
def _paged_decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     cache_seqlens: torch.Tensor, block_table: torch.Tensor, softmax_scale: float,
                     causal: bool, block_n: int, num_warps: int, num_stages: int,
                     kv_cache_modifier: str, kv_eviction: str, max_merged_splits: int,
                     k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                     kv_format: int = 0, max_registers: int = 0, swap_ab: bool = False,
                     f16_math: bool = False, int64_kv_offsets: bool = False,
                     v_pairs: bool = False, outlier_values: torch.Tensor | None = None,
                     outlier_channels: torch.Tensor | None = None, prefetch_pages: bool = False,
                     head_pairs: bool = False, gluon: bool = False, batch_cut: int = 0,
                     merge_splits_at_once: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-pass paged decode (``PagedDecodePlan.run`` with ``num_splits == 1``): ``(out
    [batch, q_len, nheads, d], lse float32 [batch, nheads, q_len])``; the config's launch fields
    are passed one by one (a dataclass cannot be an op argument). A quantized cache comes with
    its scales and its kernel format code (``QUANT_FORMATS``), and dense-and-sparse keys their
    side cache and channels (``KeyOutliers``)."""
    return _paged_decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, None, None, None,
                              softmax_scale, causal, block_n, num_warps, num_stages,
                              kv_cache_modifier, kv_eviction, max_merged_splits, k_scale,
                              v_scale, kv_format, max_registers, swap_ab, f16_math,
                              int64_kv_offsets, v_pairs, outlier_values, outlier_channels,
                              prefetch_pages, head_pairs, gluon, batch_cut, merge_splits_at_once)


@_paged_decode_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, *launch_fields):
    return _decode_outputs(q, torch.empty)


@torch.library.custom_op("kvonce::paged_decode_split",
                         mutates_args=("o_part", "lse_part", "arrivals"))
def _paged_decode_split_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_seqlens: torch.Tensor, block_table: torch.Tensor,
                           o_part: torch.Tensor, lse_part: torch.Tensor, arrivals: torch.Tensor,
                           softmax_scale: float,
                           causal: bool, block_n: int, num_warps: int, num_stages: int,
                           kv_cache_modifier: str, kv_eviction: str, max_merged_splits: int,
                           k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None, kv_format: int = 0,
                           max_registers: int = 0, swap_ab: bool = False,
                           f16_math: bool = False, int64_kv_offsets: bool = False,
                           v_pairs: bool = False, outlier_values: torch.Tensor | None = None,
                           outlier_channels: torch.Tensor | None = None,
                           prefetch_pages: bool = False, head_pairs: bool = False,
                           gluon: bool = False, batch_cut: int = 0,
                           merge_splits_at_once: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K paged decode and its merge (in the same launch up to ``max_merged_splits``
    splits, else a combine launch); ``o_part`` float32 ``[batch, q_len,
    nheads, S, d]``, ``lse_part`` float32 ``[batch, q_len, nheads, S]`` and the int32 zeros
    ``arrivals [batch, nheads_k, M-blocks]`` are the plan's scratch (written, so declared
    mutated; the arrival counts end at zero again). ``batch_cut`` > 0: the first ``batch_cut``
    sequences in one pass, the rest split (``batch_cut.BatchCutLaunch``; the partials in the
    scratch's first ``batch - batch_cut`` rows)."""
    return _paged_decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, o_part, lse_part,
                              arrivals, softmax_scale, causal, block_n, num_warps, num_stages,
                              kv_cache_modifier, kv_eviction, max_merged_splits, k_scale,
                              v_scale, kv_format, max_registers, swap_ab, f16_math,
                              int64_kv_offsets, v_pairs, outlier_values, outlier_channels,
                              prefetch_pages, head_pairs, gluon, batch_cut, merge_splits_at_once)


@_paged_decode_split_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, o_part, lse_part, arrivals,
      *launch_fields):
    return _decode_outputs(q, torch.empty)
