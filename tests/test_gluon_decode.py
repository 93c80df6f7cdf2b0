"""The Gluon paged decode (kernels/gluon_decode.py) as ``PagedDecodePlan`` runs it
(``PagedDecodeConfig.gluon``, the fp8 and int8 Hopper rows; fp16 and bf16 queries): on a Hopper
GPU against the float32 reference on the dequantized cache and against the Triton kernel, with
cache slots no sequence owns holding NaN bytes (and NaN scales), eager, in a CUDA graph, through
the custom op and under torch.compile; int8's scales read a key at a time, int4's row-major
consumers (not routed: slower than the Triton row) and fp8's / int8's swapped ones (not routed)
taken by the tests themselves. On the CPU the routing (which launches take it, their split
counts) is checked on meta tensors (Gluon has no interpreter)."""
from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch
from conftest import HAS_CUDA, poison_empty

import kvonce
import kvonce.paged.decode as decode
from kvonce.kernels import configs, gluon_decode
from kvonce.kernels.configs import _PAGED_DECODE_QUANT_TABLE
from kvonce.paged.batch_cut import BatchCutLaunch
from kvonce.paged.splits import GLUON_MIN_KEYS, busy_splits, gluon_num_splits
from kvonce.reference import paged_attention_ref

HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
hopper_only = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel needs an sm_90 GPU")
FP8_ROW = _PAGED_DECODE_QUANT_TABLE[((9, 0), "fp8_e4m3")][128]
INT8_ROW = _PAGED_DECODE_QUANT_TABLE[((9, 0), "int8")][128]
# int4: the plan's default turns ``gluon`` on where it pays (``gluon_int4_pays``); the cases
# pass the token-major row with it on, which then runs it at any launch that fits.
INT4_ROW = dataclasses.replace(_PAGED_DECODE_QUANT_TABLE[((9, 0), "int4/token-major")][128],
                               gluon=True)
ROWS = {"fp8_e4m3": FP8_ROW, "int8": INT8_ROW, "int4": INT4_ROW}
FORMAT_CODES = {"fp8_e4m3": 1, "int8": 2, "int4": 3}
KV_FORMATS = {"int4": "int4"}    # the plan's kv_format (a uint8 cache says int4 only by it)
QDTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


# ------------------------------------------------------------------------------------------------
# Routing and split counts (shapes only: any machine)
# ------------------------------------------------------------------------------------------------

def test_gluon_split_counts():
    """``gluon_num_splits`` at the shapes measured on the H200 (132 SMs; splits.py's docstring):
    short launches at one CTA an SM where that fills the SMs, else the fewest splits that fill
    a wave of two; one pass from a wave of two unless its last wave is ragged."""
    assert gluon_num_splits(8, 131072, 132) == 16      # 128 CTAs
    assert gluon_num_splits(12, 131072, 132) == 11     # 132 CTAs
    assert gluon_num_splits(24, 65536, 132) == 5       # 120 CTAs (6: 144, some SMs two)
    assert gluon_num_splits(128, 8192, 132) == 1
    assert gluon_num_splits(4, 131072, 132, tile_keys=64) == 33   # 132 CTAs (head groups)
    assert gluon_num_splits(48, 32768, 132) == 5       # 240 CTAs: 0.91 of a wave of two
    assert gluon_num_splits(96, 16384, 132) == 5       # 480 CTAs: 1.82 waves
    assert gluon_num_splits(144, 16384, 132) == 5      # 720 CTAs: 2.73 waves
    assert gluon_num_splits(192, 8192, 132) == 4       # 768 CTAs: 2.91 waves
    assert gluon_num_splits(264, 8192, 132) == 1       # one full wave
    assert gluon_num_splits(288, 8192, 132) == 3       # 1.09 waves in one pass: 864 CTAs
    assert gluon_num_splits(352, 8192, 132) == 2
    assert gluon_num_splits(512, 8192, 132) == 1
    assert gluon_num_splits(768, 8192, 132) == 1
    assert gluon_num_splits(8, 1024, 132) == 2         # no split under 512 keys
    assert gluon_num_splits(48, 2048, 132) == 4        # the cap (4): the fullest under it
    assert gluon_num_splits(0, 8192, 132) >= 1
    # int4: the most splits within one wave of two CTAs an SM (264 CTAs)
    assert gluon_num_splits(8, 131072, 132, two_ctas_an_sm=True) == 32  # 33: one empty
    assert gluon_num_splits(12, 131072, 132, two_ctas_an_sm=True) == 22
    assert gluon_num_splits(200, 8192, 132, two_ctas_an_sm=True) == 1
    assert gluon_num_splits(512, 8192, 132, two_ctas_an_sm=True) == 1
    for base in range(1, 600, 7):
        for keys in (512, 8192, 131072):
            cap = max(1, keys // 512)
            for two in (False, True):
                s = gluon_num_splits(base, keys, 132, two_ctas_an_sm=two)
                assert 1 <= s <= cap
                if base >= 0.9 * 264:
                    continue
                if two:                          # short launches: within one wave
                    assert s == 1 or base * s <= 264
                elif base * s <= 132:            # one CTA an SM: the most that fit (or capped,
                    # or the next count would leave a split empty)
                    assert base * (s + 1) > 132 or s == cap or busy_splits(keys, s + 1, 128) == s
                else:        # else a wave of two 0.9 full (if any count without empty splits)
                    counts = {busy_splits(keys, t, 128) for t in range(1, cap + 1)}
                    fill = {t: base * t / 264 / -(-base * t // 264) for t in counts}
                    assert fill[s] >= 0.9 or max(fill.values()) == fill[s] < 0.9


def _meta_plan(monkeypatch, *, batch=4, q_len=1, nheads=32, nheads_k=8, head_dim=128, page=16,
               max_keys=16384, q_dtype=torch.float16, cache_dtype=torch.float8_e4m3fn,
               head_major=False, config=FP8_ROW, capability=(9, 0), kv_format=None,
               token_major_pairs=False):
    """A plan on meta tensors, on an sm_90 device of 132 SMs by default, with ``config`` as its
    default row (``None``: the plan's own ``_default_config``)."""
    monkeypatch.setattr(decode, "device_info", lambda device: (capability, 132))
    if config is not None:
        monkeypatch.setattr(decode, "_default_config", lambda *a: config)
    else:   # the GPU's rows, not the interpreter's (which the CPU suite runs under)
        monkeypatch.setattr(configs, "interpreter_active", lambda: False)
    meta = dict(device="meta")  # shapes only: nothing launches, on any machine
    pages = batch * max_keys // page
    q = torch.empty(batch, q_len, nheads, head_dim, dtype=q_dtype, **meta)
    stored = head_dim // 2 if kv_format == "int4" else head_dim
    k = torch.empty(pages, page, nheads_k, stored, dtype=cache_dtype, **meta)
    if head_major:
        k = k.transpose(1, 2).contiguous().transpose(1, 2)
    scale = torch.empty(nheads_k, dtype=torch.float32, **meta)
    if kv_format == "int8":
        scale = torch.empty(k.shape[:3], dtype=torch.float32, **meta)
    elif kv_format == "int4":   # quantize_kv's storage: head-major pairs
        scale = torch.empty(pages, nheads_k, page, 2, dtype=torch.float32, **meta).transpose(1, 2)
        if token_major_pairs:
            scale = scale.contiguous()
    table = torch.empty(batch, max_keys // page, dtype=torch.int32, **meta)
    seqlens = torch.empty(batch, dtype=torch.int32, **meta)
    return decode.PagedDecodePlan(q, k, k, seqlens, table, k_scale=scale, v_scale=scale,
                                  kv_format=kv_format)


def test_fp8_and_int8_launches_take_the_gluon_decode(monkeypatch):
    plan = _meta_plan(monkeypatch, batch=1, max_keys=131072)
    assert plan.uses_gluon and plan.config.gluon and plan.num_splits == 16
    plan = _meta_plan(monkeypatch, batch=64, nheads=12, nheads_k=12, max_keys=8192)
    # one split: out and LSE stored by the kernel, no scratch
    assert plan.uses_gluon and plan.num_splits == 1 and plan._split_scratch[0] is None
    plan = _meta_plan(monkeypatch, batch=2, q_len=4, nheads=8, nheads_k=2, page=64)
    assert plan.uses_gluon                                      # 4 x 4 = 16 packed rows
    plan = _meta_plan(monkeypatch, q_dtype=torch.bfloat16)
    assert plan.uses_gluon
    int8 = dict(cache_dtype=torch.int8, kv_format="int8", config=INT8_ROW)
    plan = _meta_plan(monkeypatch, batch=1, max_keys=131072, **int8)
    assert plan.uses_gluon and plan.num_splits == 16             # one CTA an SM, as fp8
    plan = _meta_plan(monkeypatch, batch=1, nheads=12, nheads_k=12, max_keys=131072,
                      q_dtype=torch.bfloat16, **int8)
    assert plan.uses_gluon and plan.num_splits == 11
    plan = _meta_plan(monkeypatch, batch=2, max_keys=8192, **int8)
    assert plan.uses_gluon and plan._split_scratch[0] is not None


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8", "int4"])
def test_head_major_pages_take_the_gluon_decode(monkeypatch, fmt):
    """Pages stored head-major (``[num_pages, nheads_k, page_size, row]`` in memory) take the
    Gluon decode as token-major ones do, its launch told so (``HEAD_MAJOR``); a cache of another
    storage keeps the Triton kernel."""
    kw = {"fp8_e4m3": dict(), "int8": dict(cache_dtype=torch.int8, kv_format="int8",
                                            config=INT8_ROW),
          "int4": dict(cache_dtype=torch.uint8, kv_format="int4", config=INT4_ROW)}[fmt]
    plan = _meta_plan(monkeypatch, head_major=True, **kw)
    assert plan.uses_gluon
    meta = dict(device="meta")
    cache = torch.empty(64, 16, 8, 64 if fmt == "int4" else 128, dtype=torch.uint8, **meta)
    assert not gluon_decode.pages_head_major(cache)
    hnd = cache.transpose(1, 2).contiguous().transpose(1, 2)
    assert gluon_decode.pages_head_major(hnd)
    assert not gluon_decode.pages_head_major(hnd[:, :, :1])      # one KV head: token-major
    # pages neither token- nor head-major (a page's rows strided apart): Triton
    padded = torch.empty(64, 16, 8, 256, dtype=torch.uint8, **meta)[..., :cache.shape[3]]
    q = torch.empty(4, 1, 32, 128, dtype=torch.float16, **meta)
    code = {"fp8_e4m3": 1, "int8": 2, "int4": 3}[fmt]
    assert not gluon_decode.paged_fits(q, padded, padded, code)
    assert not gluon_decode.paged_fits(q, hnd, cache, code)            # K and V alike
    assert gluon_decode.paged_fits(q, hnd, hnd, code)
    assert gluon_decode.paged_fits(q, cache, cache, code)


def test_kv_head_groups_where_they_fit(monkeypatch):
    """``kv_head_group``: the most heads ``GLUON_KV_HEAD_GROUPS`` allows a format that divide
    ``nheads_k``, keep the group's q rows within the swapped dots' N (8) and whole pages of the
    group within a 128-key tile; head-major pages only; int8 where its scales come by ring. The
    plan counts a group's CTA once in its split count."""
    monkeypatch.setattr(gluon_decode, "GLUON_KV_HEAD_GROUPS", {1: 8, 2: 2, 3: 2})
    meta = dict(device="meta")

    def cache(heads_k, page=16, head_major=True, row=128):
        t = torch.empty(64, page, heads_k, row, dtype=torch.uint8, **meta)
        return t.transpose(1, 2).contiguous().transpose(1, 2) if head_major else t

    def q(nheads, q_len=1):
        return torch.empty(2, q_len, nheads, 128, dtype=torch.float16, **meta)

    group = gluon_decode.kv_head_group
    assert group(q(32), cache(8), 1) == 2                 # GQA 4: 2 x 4 rows
    assert group(q(32), cache(8, head_major=False), 1) == 1
    assert group(q(32, q_len=2), cache(8), 1) == 1        # 8 rows already
    assert group(q(12), cache(12), 1) == 4                # MHA: 12 heads, 8 do not divide
    assert group(q(16), cache(16), 1) == 8
    assert group(q(8), cache(8, page=32), 1) == 4         # 4 pages of 32: a tile
    assert group(q(8), cache(8, page=128), 1) == 1        # a page is a tile already
    assert group(q(12), cache(12, row=64), 3) == 2        # int4: at most 2 here
    hm_scales = torch.empty(64, 12, 16, dtype=torch.float16, **meta).transpose(1, 2)
    tm_scales = torch.empty(64, 16, 12, dtype=torch.float16, **meta)
    assert group(q(12), cache(12), 2, hm_scales, hm_scales) == 2
    assert group(q(12), cache(12), 2, tm_scales, tm_scales) == 1
    assert group(q(12), cache(12), 2) == 1                # int8: scales unknown
    monkeypatch.setattr(gluon_decode, "GLUON_KV_HEAD_GROUPS", {})
    assert group(q(12), cache(12), 1) == 1
    # the plan's split count: one CTA a group of two (4 groups: 33 splits of 63 64-key tiles)
    monkeypatch.setattr(gluon_decode, "GLUON_KV_HEAD_GROUPS", {1: 2})
    plan = _meta_plan(monkeypatch, batch=1, max_keys=131072, head_major=True)
    assert plan.uses_gluon and plan.num_splits == gluon_num_splits(4, 131072, 132, tile_keys=64)
    assert plan.num_splits == 33


def test_routing_follows_the_formats_and_query_dtypes(monkeypatch):
    """``GLUON_FORMATS`` / ``GLUON_QUERY_DTYPES`` say what the route takes."""
    int8 = dict(cache_dtype=torch.int8, kv_format="int8", config=INT8_ROW)
    monkeypatch.setattr(gluon_decode, "GLUON_FORMATS", (1,))
    assert not _meta_plan(monkeypatch, **int8).uses_gluon
    assert _meta_plan(monkeypatch).uses_gluon
    monkeypatch.setattr(gluon_decode, "GLUON_QUERY_DTYPES", (torch.float16,))
    assert not _meta_plan(monkeypatch, q_dtype=torch.bfloat16).uses_gluon


def test_swapped_operands_where_the_rows_fit(monkeypatch):
    """``GLUON_SWAP_FORMATS``: launches whose packed rows fit the swapped dots' N (8) take them,
    fp8 at once and int8 / int4 where their scales come by ring; wider ones keep the row-major
    consumers. Shipped for int4 only."""
    def launch(nheads=32, nheads_k=8, q_len=1, kv_format=1):
        meta = dict(device="meta")
        q = torch.empty(2, q_len, nheads, 128, dtype=torch.float16, **meta)
        k = torch.empty(64, 16, nheads_k, 128, dtype=torch.uint8, **meta)
        table = torch.empty(2, 32, dtype=torch.int32, **meta)
        return gluon_decode.PagedGluonDecodeLaunch(q, k, k, table, softmax_scale=0.1,
                                                   causal=False, num_splits=2, store_lse=True,
                                                   kv_format=kv_format)

    monkeypatch.setattr(gluon_decode, "GLUON_SWAP_FORMATS", (1, 2, 3))
    for kwargs, swapped in ((dict(), True), (dict(nheads=12, nheads_k=12), True),
                            (dict(q_len=2), True), (dict(q_len=4), False),
                            (dict(nheads=32, nheads_k=2), False), (dict(kv_format=2), True),
                            (dict(kv_format=3), True), (dict(kv_format=3, q_len=4), False)):
        la = launch(**kwargs)
        assert la.swap == swapped
        assert la.ring_constexprs["SWAP_AB"] == swapped
        assert la.constexprs["SWAP_AB"] == (swapped and kwargs.get("kv_format", 1) == 1)
    monkeypatch.undo()
    la = launch()
    assert not la.swap and not la.constexprs["SWAP_AB"] and not la.ring_constexprs["SWAP_AB"]
    assert not launch(kv_format=2).swap
    assert launch(kv_format=3).swap and not launch(kv_format=3, q_len=4).swap
    # int4 swapped in 256-key tiles (INT4_SWAPPED_TILE_KEYS): two stages of 32 KB
    assert launch(kv_format=3).ring_constexprs["TILE_KEYS"] == 0
    monkeypatch.setattr(gluon_decode, "INT4_SWAPPED_TILE_KEYS", 256)
    for kwargs, tile, stages in ((dict(kv_format=3), 256, 2), (dict(kv_format=3, q_len=4), 0, 4),
                                 (dict(kv_format=1), 0, 2)):
        la = launch(**kwargs)
        assert (la.ring_constexprs["TILE_KEYS"], la.ring_constexprs["STAGES"]) == (tile, stages)
    # int4's biased V (INT4_V_BIASED) rides the swapped consumers only; int8's has its own knob
    monkeypatch.setattr(gluon_decode, "INT4_V_BIASED", True)
    assert launch(kv_format=3).ring_constexprs["V_BIASED"]
    assert not launch(kv_format=3, q_len=4).ring_constexprs["V_BIASED"]
    assert not launch(kv_format=2).ring_constexprs["V_BIASED"]


def test_gluon_decode_launch_takes_its_stages(monkeypatch):
    """``GluonDecodeLaunch`` (the check scripts' launch) compiles the ring depth it is given:
    from 2026-11-29 (22224eb) to 2026-11-30 it compiled the plan's two stages whatever
    ``stages`` said, so the scripts' 3- and 4-stage variants ran at two."""
    monkeypatch.setattr(gluon_decode, "_validate", lambda *args: (0, 0))   # meta tensors
    meta = dict(device="meta")
    q = torch.empty(2, 1, 32, 128, dtype=torch.float16, **meta)
    table = torch.empty(2, 32, dtype=torch.int32, **meta)
    seqlens = torch.empty(2, dtype=torch.int32, **meta)
    o_part = torch.empty(2, 1, 32, 2, 128, **meta)
    l_part = torch.empty(2, 1, 32, 2, **meta)
    for dtype in (torch.float8_e4m3fn, torch.float16):
        k = torch.empty(64, 16, 8, 128, dtype=dtype, **meta)
        scale = torch.empty(8, **meta)
        for stages in (2, 3, 4):
            la = gluon_decode.GluonDecodeLaunch(q, k, k, scale, scale, seqlens, table, o_part,
                                                l_part, softmax_scale=0.1, num_splits=2,
                                                causal=False, stages=stages)
            assert la.constexprs["STAGES"] == stages


def test_int4_launches_where_routed(monkeypatch):
    """int4 (``KV_FORMAT`` 3) with a row with ``gluon`` on: token-major 64-byte rows with their
    (scale, offset) pairs stored head-major take the Gluon decode, short launches at a wave of
    two CTAs an SM as int8's."""
    int4 = dict(cache_dtype=torch.uint8, kv_format="int4", config=INT4_ROW)
    plan = _meta_plan(monkeypatch, batch=1, max_keys=131072, **int4)
    assert plan.uses_gluon and plan.num_splits == 32
    plan = _meta_plan(monkeypatch, batch=64, nheads=12, nheads_k=12, max_keys=8192,
                      q_dtype=torch.bfloat16, **int4)
    assert plan.uses_gluon and plan.num_splits == 1
    assert _meta_plan(monkeypatch, head_major=True, **int4).uses_gluon
    assert not _meta_plan(monkeypatch, head_dim=64, **int4).uses_gluon
    # the pairs come by TMA, a page's of one KV head a row: token-major pairs keep Triton
    assert not _meta_plan(monkeypatch, token_major_pairs=True, **int4).uses_gluon
    monkeypatch.setattr(gluon_decode, "GLUON_FORMATS", (1, 2))
    assert not _meta_plan(monkeypatch, **int4).uses_gluon


@pytest.mark.parametrize("capability", [(9, 0), (8, 0)])
def test_int4_default_rows_take_the_gluon_decode_where_it_pays(monkeypatch, capability):
    """The plan's own int4 rows (``_default_config``) keep ``gluon`` where the Gluon decode
    measured faster than the Triton int4 row (``gluon_int4_pays``: 0.7 of a wave of two CTAs an
    SM or more, at most 8 packed q rows), on sm_90 only; fp8's row keeps it everywhere."""
    int4 = dict(cache_dtype=torch.uint8, kv_format="int4", config=None, capability=capability)
    hopper = capability == (9, 0)

    def takes(**kwargs):
        plan = _meta_plan(monkeypatch, **{**int4, **kwargs})
        assert plan.uses_gluon == plan.config.gluon
        return plan.uses_gluon

    assert takes(batch=64, max_keys=8192) == hopper                      # 512 CTAs
    assert takes(batch=24, max_keys=8192) == hopper                      # 192
    assert takes(batch=16, nheads=12, nheads_k=12, max_keys=8192) == hopper
    assert takes(batch=128, max_keys=4096, q_dtype=torch.bfloat16) == hopper
    assert takes(batch=64, q_len=2, max_keys=8192) == hopper             # 8 packed rows
    assert not takes(batch=16, max_keys=8192)                # 128 CTAs: Triton measured faster
    assert not takes(batch=1, max_keys=131072)               # split launches too
    assert not takes(batch=64, q_len=4, max_keys=8192)       # 16 rows: no swapped operands
    assert not takes(batch=64, nheads=32, nheads_k=2, max_keys=8192)
    fp8 = dict(config=None, capability=capability)
    assert _meta_plan(monkeypatch, batch=1, max_keys=131072, **fp8).uses_gluon == hopper


@pytest.mark.parametrize("case", ["int4 short", "fp32 q",
                                  "group x q_len 32", "head dim 64", "short", "sm_80",
                                  "row without gluon", "int8 row without gluon"])
def test_other_launches_keep_the_triton_decode(monkeypatch, case):
    """Every launch the Gluon kernel cannot run (or was not measured on) keeps the Triton one,
    with the row's own split rule."""
    kwargs = {"int4 short": dict(cache_dtype=torch.uint8, kv_format="int4", config=None),
              "fp32 q": dict(q_dtype=torch.float32),
              "group x q_len 32": dict(q_len=8),
              "head dim 64": dict(head_dim=64),
              "short": dict(max_keys=GLUON_MIN_KEYS // 2),
              "sm_80": dict(capability=(8, 0)),
              "row without gluon": dict(config=dataclasses.replace(FP8_ROW, gluon=False)),
              "int8 row without gluon": dict(
                  cache_dtype=torch.int8, kv_format="int8",
                  config=dataclasses.replace(INT8_ROW, gluon=False)),
              }[case]
    plan = _meta_plan(monkeypatch, **kwargs)
    assert not plan.uses_gluon and not plan.config.gluon


# ------------------------------------------------------------------------------------------------
# On a Hopper GPU
# ------------------------------------------------------------------------------------------------

def _poison_unowned(kq, vq, ks, vs, seqlens, table):
    """In every cache slot no sequence owns: NaN bytes (fp8 0x7F; int8: the largest byte, 127;
    int4: two nibbles 7 and 15) and, for int8's and int4's per-key scales, NaN scales (and
    offsets)."""
    page = kq.shape[1]
    owned = torch.zeros(kq.shape[:2], dtype=torch.bool, device=kq.device)
    for b, n in enumerate(seqlens.tolist()):
        pos = torch.arange(n, device=kq.device)
        owned[table[b, pos // page].long(), pos % page] = True
    for t in (kq, vq):
        t.view(torch.uint8)[~owned] = 0x7F
    if ks.dim() >= 3:
        ks[~owned] = float("nan")
        vs[~owned] = float("nan")


def _case(fmt, batch, q_len, nheads, nheads_k, page, lens, max_keys, seed=0,
          q_dtype=torch.float16, scale_dtype=None):
    torch.manual_seed(seed)
    pages_per_seq = max_keys // page
    num_pages = batch * pages_per_seq + 2
    q = torch.randn(batch, q_len, nheads, 128, device="cuda").to(q_dtype)
    if q_dtype == torch.bfloat16:
        q[:, :, 0] *= 1e5    # a row far outside fp16's range: the kernel scales it into fp16
    k = torch.randn(num_pages, page, nheads_k, 128, device="cuda")
    v = torch.randn(num_pages, page, nheads_k, 128, device="cuda")
    k[..., 5] *= 20.0
    v[num_pages // 2:] *= 300.0   # V scales of different sizes (int8: the tile's unit changes)
    kq, ks = kvonce.quantize_kv(k, fmt, scale_dtype=scale_dtype)
    vq, vs = kvonce.quantize_kv(v, fmt, scale_dtype=scale_dtype)
    table = torch.randperm(num_pages, device="cuda")[:batch * pages_per_seq]
    table = table.reshape(batch, pages_per_seq).to(torch.int32)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kd = kvonce.dequantize_kv(kq, ks, fmt, torch.float32)
    vd = kvonce.dequantize_kv(vq, vs, fmt, torch.float32)
    return q, kq, vq, ks, vs, seqlens, table, kd, vd


# (batch, q_len, nheads, nheads_k, page, lens, max_keys, num_splits (0: the plan's))
GPU_CASES = [
    (3, 1, 32, 8, 16, [8192, 0, 5000], 8192, 0),          # an empty sequence, off the tile grid
    (2, 1, 12, 12, 16, [9000, 17], 16384, 0),             # MHA, lengths off every grid
    (1, 1, 32, 8, 16, [131072], 131072, 0),               # 16 splits
    (2, 2, 32, 8, 64, [8192, 1], 8192, 0),                # q_len 2 (8 rows); causal: q_len > len
    (2, 4, 8, 2, 32, [12000, 8190], 12288, 3),            # 16 packed rows, boxes of 32
    (4, 1, 16, 1, 256, [8192, 300, 1, 7000], 8192, 2),    # GQA 16, 256-key pages
    (2, 2, 8, 2, 16, [4000, 2], 4096, 1),                 # one split: out and LSE stored directly
    (66, 1, 32, 8, 16, [2048] * 65 + [1000], 2048, 0),    # 528 CTAs: the plan's one pass
]


def _spy_scale_rings(monkeypatch) -> list:
    """Counts the launches whose scales come by TMA (``SCALE_RING``)."""
    calls = []
    real = gluon_decode.PagedGluonDecodeLaunch._scales_desc

    def spy(self, scale):
        calls.append(scale.shape)
        return real(self, scale)

    monkeypatch.setattr(gluon_decode.PagedGluonDecodeLaunch, "_scales_desc", spy)
    return calls


# The formats' routes. int8 routes read float32 scales unless they name fp16 ones
# (quantize_kv's default since 2026-11-29): "int8 fp16 scale ring", the shipped route, brings
# them by TMA (INT8_FP16_SCALE_RING, two keys a 32-bit unit), "int8 fp16 scales" a key at a
# time (the ring off). float32 scales as quantize_kv stores them (head-major) by TMA ("int8
# ring", INT8_SCALES_BY_TMA) or read a key at a time ("int8"), or stored token-major ("int8
# token-major scales": a key at a time, other strides). int4's always by TMA, row-major
# consumers ("int4": not routed) or swapped ("int4 swapped", routed; V as 1024 + n where the
# route says "v-biased": INT4_V_BIASED, shipped; the module's loader warps, GLUON_LOADERS: int4
# and int8 four, unless the route says "1 loader", for int8 too); "int8
# v-biased": by TMA with V as 1152 + x
# (INT8_V_BIASED: correct, not faster, off).
# "... swapped": the swapped-operand consumers (GLUON_SWAP_FORMATS: int4's shipped, fp8's and
# int8's correct and not faster) where the packed rows fit 8; "fp32 pairs": int4's float32
# (scale, offset) pairs (quantize_kv's default is fp16); "t256": int4's in 256-key tiles
# (INT4_SWAPPED_TILE_KEYS: correct, even with 128-key tiles, off); int4's swapped consumers keep
# the rows' sums a thread's part a tile (INT4_DEFER_SUMS, shipped) unless the route says
# "shuffled sums" (the lanes' sums added every tile, as before).
ROUTES = ["fp8_e4m3", "int8 ring", "int8", "int8 token-major scales", "int4", "int8 v-biased",
          "fp8_e4m3 swapped", "int8 swapped", "int8 swapped v-biased", "int4 swapped",
          "int4 swapped t256", "int4 fp32 pairs", "int4 swapped fp32 pairs", "int8 fp16 scales",
          "int4 swapped v-biased", "int8 fp16 scale ring", "int4 swapped v-biased 1 loader",
          "int8 fp16 scale ring 1 loader", "int4 swapped v-biased shuffled sums"]
RING_ROUTES = ("int8 ring", "int4", "int8 v-biased", "int8 swapped", "int8 swapped v-biased",
               "int4 swapped", "int4 swapped t256", "int4 fp32 pairs", "int4 swapped fp32 pairs",
               "int4 swapped v-biased", "int8 fp16 scale ring", "int4 swapped v-biased 1 loader",
               "int8 fp16 scale ring 1 loader", "int4 swapped v-biased shuffled sums")


@hopper_only
@pytest.mark.parametrize("q_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_gluon_decode_matches_reference_and_triton(case, causal, route, q_dtype, monkeypatch):
    fmt = _take_route(route, monkeypatch)
    rings = _spy_scale_rings(monkeypatch)
    plan = _check_against_reference_and_triton(
        case, causal, fmt, q_dtype, token_major_scales="token-major" in route,
        scale_dtype=_scale_dtype(route))
    assert bool(rings) == (route in RING_ROUTES)
    batch, q_len, nheads, nheads_k = GPU_CASES[case][:4]
    swapped = "swapped" in route and nheads // nheads_k * q_len <= 8
    assert all(la.swap == swapped for la in _launch_parts(plan))


def _launch_parts(plan) -> list:
    """The plan's launches, a batch cut's (``paged.batch_cut``) as its two parts."""
    return [part for la in plan._launches.values()
            for part in ((la.head, la.tail) if isinstance(la, BatchCutLaunch) else (la,))]


def _check_against_reference_and_triton(case, causal, fmt, q_dtype, token_major_scales=False,
                                        head_major=False, scale_dtype=None):
    """``case``: an index into ``GPU_CASES`` or such a tuple."""
    spec = GPU_CASES[case] if isinstance(case, int) else case
    batch, q_len, nheads, nheads_k, page, lens, max_keys, splits = spec
    q, kq, vq, ks, vs, seqlens, table, kd, vd = _case(fmt, batch, q_len, nheads, nheads_k, page,
                                                      lens, max_keys, q_dtype=QDTYPES[q_dtype],
                                                      scale_dtype=scale_dtype)
    if scale_dtype is not None:
        assert ks.dtype == vs.dtype == scale_dtype
    if token_major_scales:
        ks, vs = ks.contiguous(), vs.contiguous()
    if head_major:   # the same logical pages stored [num_pages, nheads_k, page_size, row]
        kq, vq = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (kq, vq))
        assert gluon_decode.pages_head_major(kq) == (nheads_k > 1)
    tol = 2e-3 if q_dtype == "fp16" else 8e-3    # the output's own rounding
    ref, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table, causal=causal)
    _poison_unowned(kq, vq, ks, vs, seqlens, table)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  causal=causal, num_splits=splits, config=ROWS[fmt],
                                  kv_format=KV_FORMATS.get(fmt))
    assert plan.uses_gluon
    with poison_empty:
        out, lse = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs, return_lse=True)
    assert all(type(la).__name__ == "PagedGluonDecodeLaunch" for la in plan._launches.values())
    assert not torch.isnan(out).any()
    rel = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()
    assert rel < tol, f"relative error {rel:.2e}"
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert ((lse[fin] - ref_lse[fin]).abs() / ref_lse[fin].abs().clamp_min(1.0)).max() < 1e-3
    assert (out[~fin.transpose(1, 2)] == 0).all()      # rows that see no key: 0, LSE -inf
    triton_plan = kvonce.PagedDecodePlan(
        q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs, causal=causal,
        num_splits=plan.num_splits, config=dataclasses.replace(ROWS[fmt], gluon=False),
        kv_format=KV_FORMATS.get(fmt))
    assert not triton_plan.uses_gluon
    tri = triton_plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    assert (out.float() - tri.float()).abs().max() <= 2 * tol * ref.abs().max() + 1e-3
    # no LSE: the same output; the custom op: the same bytes
    assert torch.equal(plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs), out)
    op_out, op_lse = plan._run_op(q, kq, vq, seqlens, table, ks, vs)
    assert torch.equal(op_out, out) and torch.equal(op_lse, lse)
    return plan


@hopper_only
@pytest.mark.parametrize("q_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("route", ["fp8_e4m3", "int8 fp16 scale ring", "int8 ring",
                                   "int4 swapped v-biased"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_gluon_decode_on_head_major_pages(case, causal, route, q_dtype, monkeypatch):
    """Pages stored head-major (a page's keys of one KV head contiguous: one TMA box a page and
    head, ``HEAD_MAJOR``) on the shipped routes (and int8's float32 scale ring), against the
    reference and the Triton kernel on the same caches."""
    fmt = _take_route(route, monkeypatch)
    plan = _check_against_reference_and_triton(case, causal, fmt, q_dtype, head_major=True,
                                               scale_dtype=_scale_dtype(route))
    nheads_k = GPU_CASES[case][3]
    assert all(la.head_major == (nheads_k > 1) for la in plan._launches.values())


# KV head groups (GLUON_KV_HEAD_GROUPS): GPU_CASES' head-major launches that group (GQA 32/8:
# two heads a CTA; MHA 12/12: four), and more: q_len 2 at GQA 2 (two heads, 8 rows; causal:
# a row sees no key), MHA on pages of 32 (four heads, a box 128 rows), GQA 4 on pages of 64
# (two heads, a box a whole tile), one sequence of 131072 keys (the plan's splits).
HEAD_GROUP_CASES = [
    GPU_CASES[0], GPU_CASES[1], GPU_CASES[7],
    (2, 2, 8, 4, 16, [5000, 1], 8192, 0),
    (3, 1, 8, 8, 32, [3000, 9000, 31], 12288, 2),
    (2, 1, 32, 8, 64, [8192, 4097], 8192, 0),
    (1, 1, 12, 12, 16, [131072], 131072, 0),
]
HEAD_GROUP_HEADS = [2, 4, 2, 2, 4, 2, 4]     # kv_head_group's choice for each, from 8 at most


@hopper_only
@pytest.mark.parametrize("q_dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("route", ["fp8_e4m3", "int8 fp16 scale ring", "int8 ring",
                                   "int4 swapped v-biased"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", range(len(HEAD_GROUP_CASES)))
def test_gluon_decode_kv_head_groups(case, causal, route, q_dtype, monkeypatch):
    """A CTA taking a group of KV heads (``GLUON_KV_HEAD_GROUPS``, head-major pages: a TMA box a
    whole page of the group, each score masked to its own head), every format, against the
    reference and the Triton kernel, unowned slots poisoned."""
    fmt = _take_route(route, monkeypatch)
    monkeypatch.setattr(gluon_decode, "GLUON_KV_HEAD_GROUPS", {1: 8, 2: 8, 3: 8})
    spec = HEAD_GROUP_CASES[case]
    plan = _check_against_reference_and_triton(spec, causal, fmt, q_dtype, head_major=True,
                                               scale_dtype=_scale_dtype(route))
    nheads_k = spec[3]
    want = HEAD_GROUP_HEADS[case]
    for la in plan._launches.values():
        assert la.heads == want and la.swap and la.grid[1] == nheads_k // want


@hopper_only
@pytest.mark.parametrize("route", ["fp8_e4m3", "int8 fp16 scale ring", "int4 swapped v-biased"])
def test_gluon_decode_kv_head_groups_in_a_cuda_graph(route, monkeypatch):
    """KV head groups captured in a CUDA graph: replays follow new lengths and queries."""
    _take_route(route, monkeypatch)
    monkeypatch.setattr(gluon_decode, "GLUON_KV_HEAD_GROUPS", {1: 2, 2: 2, 3: 2})
    fmt = route.split()[0]
    q, kq, vq, ks, vs, seqlens, table, kd, vd = _case(fmt, 2, 1, 32, 8, 16, [8192, 4000], 8192,
                                                      scale_dtype=_scale_dtype(route))
    kq, vq = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (kq, vq))
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  config=ROWS[fmt], kv_format=KV_FORMATS.get(fmt))
    eager = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    assert all(la.heads == 2 for la in plan._launches.values())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    seqlens.copy_(torch.tensor([3000, 8192], dtype=torch.int32))
    q.copy_(torch.randn_like(q))
    graph.replay()
    ref = paged_attention_ref(q.float(), kd, vd, seqlens, table)[0]
    rel = ((captured.float() - ref).norm() / ref.norm()).item()
    assert rel < 2e-3, f"relative error {rel:.2e}"
    assert not torch.equal(captured, eager)


@hopper_only
@pytest.mark.parametrize("loaders", [1, 4])
@pytest.mark.parametrize("head_major", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_gluon_decode_cp_async_loaders(case, causal, head_major, loaders, monkeypatch):
    """fp8's loader warps copying by cp.async (``GLUON_CP_ASYNC_FORMATS``: 16 bytes a thread,
    every loader thread's arrival on the ready barrier) instead of TMA boxes, one and four
    loader warps, token- and head-major pages, against the reference and the Triton kernel."""
    _take_route("fp8_e4m3 cp.async", monkeypatch)
    monkeypatch.setattr(gluon_decode, "GLUON_LOADERS", {1: loaders, 2: 4, 3: 4})
    plan = _check_against_reference_and_triton(case, causal, "fp8_e4m3", "fp16",
                                               head_major=head_major)
    assert all(la.constexprs["CP_ASYNC"] for la in plan._launches.values())


def _gluon_plan(route, nheads, nheads_k, lens):
    """A plan on the Gluon route over a fresh ``_case`` (page 16, 8192 keys a sequence) with the
    route's scales."""
    fmt = route.split()[0]
    case = _case(fmt, len(lens), 1, nheads, nheads_k, 16, lens, 8192,
                 scale_dtype=_scale_dtype(route))
    q, kq, vq, ks, vs, seqlens, table = case[:7]
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  config=ROWS[fmt], kv_format=KV_FORMATS.get(fmt))
    assert plan.uses_gluon
    return plan, case


def _scale_dtype(route):
    """The scales a ``ROUTES`` entry reads: int8's float32 unless it names fp16 ones, int4's
    pairs fp16 (None: quantize_kv's default) unless it names float32 ones."""
    if route.startswith("int8"):
        return torch.float16 if "fp16 scale" in route else torch.float32
    return torch.float32 if "fp32 pairs" in route else None


def _take_route(route, monkeypatch) -> str:
    """The format of a ``ROUTES`` entry, its route set up (int8 scales by TMA or a key at a time,
    V biased or not, swapped operands or row-major consumers)."""
    fmt = route.split()[0]
    monkeypatch.setattr(gluon_decode, "INT8_SCALES_BY_TMA",
                        route in RING_ROUTES or "fp16 scales" in route)
    monkeypatch.setattr(gluon_decode, "INT8_V_BIASED", "v-biased" in route)
    monkeypatch.setattr(gluon_decode, "INT4_V_BIASED", "v-biased" in route)
    monkeypatch.setattr(gluon_decode, "INT8_FP16_SCALE_RING", "scale ring" in route)
    monkeypatch.setattr(gluon_decode, "GLUON_SWAP_FORMATS",
                        (1, 2, 3) if "swapped" in route else ())
    monkeypatch.setattr(gluon_decode, "INT4_SWAPPED_TILE_KEYS", 256 if "t256" in route else 128)
    # loader warps: the module's (int4 / int8 4, fp8 1) unless the route names a count
    loaders = dict(gluon_decode.GLUON_LOADERS)
    if "1 loader" in route:
        loaders = {code: 1 for code in loaders}
    monkeypatch.setattr(gluon_decode, "GLUON_LOADERS", loaders)
    monkeypatch.setattr(gluon_decode, "GLUON_CP_ASYNC_FORMATS",
                        (1,) if "cp.async" in route else ())
    monkeypatch.setattr(gluon_decode, "INT4_DEFER_SUMS", "shuffled sums" not in route)
    return fmt


@hopper_only
@pytest.mark.parametrize("q_dtype", ["fp16", "bf16"])
def test_int4_default_plan_takes_the_gluon_decode_where_it_pays(q_dtype):
    """The plan's own int4 row (no config given) at 48 sequences x 8 KV heads (384 CTAs, 1.5
    of a wave of two on 132 SMs; ``gluon_int4_pays`` wherever the GPU has at most 274 SMs) runs
    the Gluon decode's swapped operands and matches the reference, with unowned slots poisoned;
    one sequence keeps the Triton kernel."""
    lens = [2048 - 37 * i for i in range(48)]
    q, kq, vq, ks, vs, seqlens, table, kd, vd = _case("int4", 48, 1, 32, 8, 16, lens, 2048,
                                                      q_dtype=QDTYPES[q_dtype])
    ref = paged_attention_ref(q.float(), kd, vd, seqlens, table)[0]
    _poison_unowned(kq, vq, ks, vs, seqlens, table)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  kv_format="int4")
    assert plan.uses_gluon and plan.config.gluon
    with poison_empty:
        out = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    assert all(la.swap for la in _launch_parts(plan))
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if q_dtype == "fp16" else 8e-3), f"relative error {rel:.2e}"
    one = kvonce.PagedDecodePlan(q[:1], kq, vq, seqlens[:1], table[:1], k_scale=ks,
                                 v_scale=vs, kv_format="int4")
    assert not one.uses_gluon and not one.config.gluon


@hopper_only
@pytest.mark.parametrize("route", ["fp8_e4m3", "int8 fp16 scale ring", "int8 ring",
                                   "int4 swapped v-biased"])
def test_gluon_decode_follows_the_caches_it_is_given(route, monkeypatch):
    """A launch keeps the TMA descriptors of the caches and scales it ran on
    (``DescriptorCache``, over non-owning aliases): a call on other caches (other tensors, other
    addresses) reads those, a call on the first caches rewritten in place their new bytes, and
    the kept descriptors keep no cache alive."""
    fmt = _take_route(route, monkeypatch)
    plan, (q, kq, vq, ks, vs, seqlens, table, kd, vd) = _gluon_plan(route, 32, 8, [8192, 4000])
    first = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    _, kq2, vq2, ks2, vs2, _, _, kd2, vd2 = _case(fmt, 2, 1, 32, 8, 16, [8192, 4000], 8192,
                                                  seed=1, scale_dtype=_scale_dtype(route))
    out = plan.run(q, kq2, vq2, seqlens, table, k_scale=ks2, v_scale=vs2)
    ref = paged_attention_ref(q.float(), kd2, vd2, seqlens, table)[0]
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 2e-3, f"relative error {rel:.2e}"
    assert not torch.equal(out, first)
    for first_t, second_t in ((kq, kq2), (vq, vq2), (ks, ks2), (vs, vs2)):
        first_t.copy_(second_t)
    assert torch.equal(plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs), out)
    # the kept descriptors hold no cache: the second caches are freed with their last reference
    kept = [weakref.ref(t) for t in (kq2, vq2, ks2, vs2)]
    del kq2, vq2, ks2, vs2, kd2, vd2, first_t, second_t
    gc.collect()
    assert all(r() is None for r in kept)
    assert sum(len(la._descs) for la in plan._launches.values()) >= 4


@hopper_only
@pytest.mark.parametrize("route", ["fp8_e4m3", "int8", "int8 ring", "int8 fp16 scale ring",
                                   "int4", "int8 v-biased", "fp8_e4m3 swapped",
                                   "int8 swapped v-biased", "int4 swapped",
                                   "int4 swapped v-biased", "int4 swapped t256",
                                   "int4 swapped v-biased shuffled sums"])
def test_gluon_decode_in_a_cuda_graph_and_compiled(route, monkeypatch):
    _take_route(route, monkeypatch)
    plan, (q, kq, vq, ks, vs, seqlens, table, kd, vd) = _gluon_plan(route, 32, 8, [8192, 4000])
    eager = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    seqlens.copy_(torch.tensor([3000, 8192], dtype=torch.int32))   # values change, not shapes
    q.copy_(torch.randn_like(q))
    graph.replay()
    ref = paged_attention_ref(q.float(), kd, vd, seqlens, table)[0]
    rel = ((captured.float() - ref).norm() / ref.norm()).item()
    assert rel < 2e-3, f"relative error {rel:.2e}"
    assert not torch.equal(captured, eager)

    def step(q, kq, vq, seqlens, table, ks, vs):
        return plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs, return_lse=True)

    out, lse = torch.compile(step, fullgraph=True)(q, kq, vq, seqlens, table, ks, vs)
    again, again_lse = step(q, kq, vq, seqlens, table, ks, vs)
    assert torch.equal(out, again) and torch.equal(lse, again_lse)


@hopper_only
@pytest.mark.parametrize("route", ["fp8_e4m3", "int8", "int8 ring", "int8 fp16 scale ring",
                                   "int4"])
def test_opcheck_gluon_split_op(route, monkeypatch):
    fmt = _take_route(route, monkeypatch)
    plan, (q, kq, vq, ks, vs, seqlens, table, _, _) = _gluon_plan(route, 8, 2, [8192, 100])
    c = plan.config
    fields = (plan.softmax_scale, True, c.block_n, c.num_warps, c.num_stages,
              c.kv_cache_modifier, c.kv_eviction, c.max_merged_splits, ks, vs,
              FORMAT_CODES[fmt], c.max_registers,
              c.swap_ab, c.f16_math, c.int64_kv_offsets, c.v_pairs, None, None,
              c.prefetch_pages, c.head_pairs, True)
    # torch 2.11 lacks the float8 arithmetic opcheck's schema test compares inputs with
    utils = tuple(u for u in torch.library._OPCHECK_DEFAULT_UTILS
                  if fmt != "fp8_e4m3" or u != "test_schema")
    torch.library.opcheck(torch.ops.kvonce.paged_decode_split,
                          (q, kq, vq, seqlens, table, *plan._scratch(), *fields),
                          test_utils=utils)


def test_one_cta_variant_takes_only_launches_of_one_cta_an_sm(monkeypatch):
    """``GLUON_ONE_CTA_VARIANT`` (off by default) replaces the plan variant's ring depth, merge
    and register cap for fp8 / int8 launches of at most one CTA an SM; longer launches and
    int4 keep theirs."""
    monkeypatch.setattr(gluon_decode, "device_info", lambda device: ((9, 0), 132))
    meta = dict(device="meta")

    def launch(batch, num_splits, fmt=1, variant=None):
        monkeypatch.setattr(gluon_decode, "GLUON_ONE_CTA_VARIANT", variant)
        q = torch.empty(batch, 1, 32, 128, dtype=torch.float16, **meta)
        row = 64 if fmt == 3 else 128
        cache = torch.empty(batch * 512, 16, 8, row, dtype=torch.uint8, **meta)
        cache = cache.transpose(1, 2).contiguous().transpose(1, 2)
        scale = torch.empty(8, dtype=torch.float32, **meta)
        if fmt != 1:
            scale = torch.empty(batch * 512, 8, 16, *((2,) if fmt == 3 else ()),
                                dtype=torch.float32, **meta).transpose(1, 2)
        table = torch.empty(batch, 512, dtype=torch.int32, **meta)
        return gluon_decode.PagedGluonDecodeLaunch(
            q, cache, cache, table, softmax_scale=0.1, causal=False, num_splits=num_splits,
            store_lse=False, kv_format=fmt, k_scale=scale, v_scale=scale)

    one_cta = dict(stages=4, ctas_per_sm=1, ring_merge=False)
    plan_variant = gluon_decode.GLUON_PLAN_VARIANT
    for fmt in (1, 2):
        default = launch(1, 16, fmt)                       # 128 CTAs, the variant unset
        assert default.constexprs["STAGES"] == plan_variant["stages"]
        assert default.maxnreg == gluon_decode.TWO_CTA_MAXNREG
        short = launch(1, 16, fmt, one_cta)                # 128 CTAs of 132 SMs
        assert short.constexprs["STAGES"] == 4 and not short.constexprs["RING_MERGE"]
        assert short.maxnreg == 0 and short.key != default.key
        assert launch(1, 33, fmt, one_cta).constexprs["STAGES"] == plan_variant["stages"]
        assert launch(64, 1, fmt, one_cta).constexprs["STAGES"] == plan_variant["stages"]
    int4 = launch(1, 16, 3, one_cta)
    assert int4.maxnreg == gluon_decode.TWO_CTA_MAXNREG

