"""The warp-specialized Gluon paged prefill (kernels/gluon_prefill.py) against the float32
reference on a Hopper GPU: page sizes 16 to 256 (boxes of 16 to 128 rows, tiles spanning
pages and pages spanning tiles), GQA groups, head dims, causal and not, fp16 and bf16, cache slots
no sequence owns filled with NaN. On the CPU only the routing is checked (Gluon has no
interpreter)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import HAS_CUDA, poison_empty
from test_paged_prefill import check_lse, make_case, max_q, rel_err

import kvonce
from kvonce.kernels import gluon_prefill
from kvonce.kernels.configs import PagedPrefillConfig
from kvonce.reference import paged_prefill_ref

HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
hopper_only = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel needs a Hopper GPU")
GLUON = PagedPrefillConfig(128, 64, 8, 3, last_tiles_first=True, gluon=True)
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}
# (q_len, cache_seqlen): no rows, decode rows, chunks over longer histories, whole prompts, and
# lengths off every tile and page grid.
LENS = [(0, 900), (1, 3000), (300, 2100), (1000, 1000), (77, 213), (1, 1), (129, 129), (5, 8)]


def _poison_unowned(k, v, seqlens, table):
    """NaN in every cache slot no sequence owns (past a sequence's end in its last page, spare
    and free pages): the kernel must neither read them into a result nor let 0 * NaN through."""
    page_size = k.shape[1]
    owned = torch.zeros(k.shape[:2], dtype=torch.bool, device=k.device)
    for b, n in enumerate(seqlens.tolist()):
        pos = torch.arange(n, device=k.device)
        owned[table[b, pos // page_size].long(), pos % page_size] = True
    k[~owned] = float("nan")
    v[~owned] = float("nan")


def _launch_is_gluon(plan) -> bool:
    return all(launch._gluon is not None for launch in plan._launches.values())


@hopper_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("nheads,nheads_k,head_dim,page_size,block_n,stages", [
    (32, 8, 128, 16, 128, 3),   # GQA 4, boxes of one page (the Hopper row)
    (32, 8, 128, 256, 128, 3),  # pages of two tiles
    (32, 8, 128, 16, 128, 2),   # a ring of two slots
    (8, 8, 128, 16, 64, 3),     # MHA, 64-key tiles of four pages
    (16, 2, 64, 32, 64, 2),     # GQA 8, d64, 64-key tiles
    (4, 2, 128, 128, 64, 3),    # GQA 2, a page of two 64-key tiles
    (64, 1, 64, 64, 128, 3),    # GQA 64: two tokens a tile
])
def test_gluon_prefill_against_reference(dtype, causal, nheads, nheads_k, head_dim, page_size,
                                         block_n, stages):
    case = make_case(LENS, nheads=nheads, nheads_k=nheads_k, head_dim=head_dim,
                     page_size=page_size, dtype=dtype)
    config = dataclasses.replace(GLUON, gluon_block_n=block_n, gluon_stages=stages)
    plan, out = _check_against_reference(case, causal, config)
    q, k, v, cu, seqlens, table = case
    out2 = plan.run(q, k, v, cu, seqlens, table)   # no lse: the STORE_LSE=False kernel
    assert torch.equal(out2, out)


def _check_against_reference(case, causal, config):
    """``case`` (make_case's tuple) planned and run through the Gluon kernel, its unowned cache
    slots poisoned with NaN after the float32 reference is taken: output and lse within
    tolerance. Returns ``(plan, out)``."""
    q, k, v, cu, seqlens, table = case
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                                     causal=causal)
    _poison_unowned(k, v, seqlens, table)
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                   causal=causal, config=config)
    with poison_empty:
        out, lse = plan.run(q, k, v, cu, seqlens, table, return_lse=True)
    assert _launch_is_gluon(plan)
    err = rel_err(out, ref)
    assert err < TOL[q.dtype], f"relative error {err:.2e}"
    check_lse(lse, ref_lse)
    return plan, out


# The softmax forms' shapes: the Hopper row; GQA 6 (padding rows); GQA 8, d64, 64-key tiles.
SOFTMAX_SHAPES = [(32, 8, 128, 16, 128), (12, 2, 128, 32, 128), (16, 2, 64, 32, 64)]


# The kernel's other forms, each knob set (so the expected constants do not follow the shipped
# defaults): FA4's conditional rescale, the row reductions as one chain a row, P's row sums by
# the tensor core; (knobs, SOFTMAX_FORM).
FORMS = {
    "lazy": (dict(LAZY_RESCALE=True, ROW_TREE=True, ROW_SUM_MMA=False), 12),
    "chain": (dict(LAZY_RESCALE=False, ROW_TREE=False, ROW_SUM_MMA=False), 0),
    "summma": (dict(LAZY_RESCALE=False, ROW_TREE=True, ROW_SUM_MMA=True), 72),
}


@hopper_only
@pytest.mark.parametrize("form_name", list(FORMS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("spikes", [False, True])
@pytest.mark.parametrize("nheads,nheads_k,head_dim,page_size,block_n", SOFTMAX_SHAPES)
def test_gluon_prefill_forms(monkeypatch, form_name, dtype, causal, spikes, nheads, nheads_k,
                             head_dim, page_size, block_n):
    """The kernel's other forms against the reference: ``LAZY_RESCALE`` (FA4's conditional
    rescale: a warp keeps its rows' max until one grows by more than 2^8), ``ROW_TREE`` off
    (the rows' max and sum as one chain a row) and ``ROW_SUM_MMA`` (P's row sums as ``P @
    ones`` on the tensor core). ``spikes``: 1% of the keys 12x larger, so rows' maxima jump by
    far more than the lazy threshold in later tiles and warps take both paths."""
    knobs, form = FORMS[form_name]
    q, k, v, cu, seqlens, table = make_case(LENS, nheads=nheads, nheads_k=nheads_k,
                                            head_dim=head_dim, page_size=page_size, dtype=dtype)
    if spikes:
        gen = torch.Generator(device=k.device).manual_seed(7)
        big = torch.rand(k.shape[:3], generator=gen, device=k.device) < 0.01
        k = torch.where(big[..., None], k * 12, k)
    for name, value in knobs.items():
        monkeypatch.setattr(gluon_prefill, name, value)
    config = dataclasses.replace(GLUON, gluon_block_n=block_n, gluon_persistent=True)
    plan, _ = _check_against_reference((q, k, v, cu, seqlens, table), causal, config)
    assert all(launch._gluon._constexprs["SOFTMAX_FORM"] == form
               for launch in plan._launches.values())


@hopper_only
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("nheads,nheads_k,head_dim,page_size,block_n,stages", [
    (32, 8, 128, 16, 128, 3),   # the Hopper row: ~750 work items, ~6 a CTA
    (32, 8, 128, 256, 128, 2),  # pages of two tiles, a ring of two slots
    (8, 8, 128, 16, 64, 3),     # MHA, 64-key tiles
    (12, 2, 128, 32, 128, 3),   # GQA 6: padding rows
    (16, 2, 64, 32, 64, 2),     # GQA 8, d64: fewer items than SMs
])
def test_gluon_prefill_persistent(causal, nheads, nheads_k, head_dim, page_size, block_n,
                                  stages):
    """``gluon_persistent``: one CTA an SM walking the work items, its K/V ring and barrier
    phases running on across items, gives the bytes of one CTA an item (the same arithmetic
    per item), and the reference's values."""
    q, k, v, cu, seqlens, table = make_case(LENS, nheads=nheads, nheads_k=nheads_k,
                                            head_dim=head_dim, page_size=page_size,
                                            dtype=torch.bfloat16)
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                                     causal=causal)
    _poison_unowned(k, v, seqlens, table)
    config = dataclasses.replace(GLUON, gluon_block_n=block_n, gluon_stages=stages)
    outs = []
    for persistent in (False, True):
        plan = kvonce.PagedPrefillPlan(
            q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu), causal=causal,
            config=dataclasses.replace(config, gluon_persistent=persistent))
        with poison_empty:
            outs.append(plan.run(q, k, v, cu, seqlens, table, return_lse=True))
        assert _launch_is_gluon(plan)
    (want, want_lse), (out, lse) = outs
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    check_lse(lse, ref_lse)


def _same_bytes_under(monkeypatch, knob, values, case, config, launch_shows, causal=True):
    """Run ``case`` (make_case's tuple) with ``gluon_prefill.<knob>`` set to each of ``values``
    in turn; each plan's Gluon launches must pass ``launch_shows(launch, value)`` and every run
    must give the first one's output and lse bytes."""
    q, k, v, cu, seqlens, table = case
    outs = []
    for value in values:
        monkeypatch.setattr(gluon_prefill, knob, value)
        plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                       causal=causal, config=config)
        with poison_empty:
            outs.append(plan.run(q, k, v, cu, seqlens, table, return_lse=True))
        assert _launch_is_gluon(plan)
        assert all(launch_shows(launch._gluon, value) for launch in plan._launches.values())
    (want, want_lse), *rest = outs
    for out, lse in rest:
        assert torch.equal(out, want) and torch.equal(lse, want_lse)


@hopper_only
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("page_size,block_n", [(16, 128), (32, 64), (128, 128), (256, 128)])
def test_gluon_prefill_scalar_page_ids(monkeypatch, persistent, page_size, block_n):
    """``SCALAR_PAGES``: the loader's page ids as scalar loads (tiles of several boxes) give the
    tile-ahead vector form's bytes; tiles of one box keep the vector form."""
    case = q, k, v, cu, seqlens, table = make_case(LENS, nheads=32, nheads_k=8, head_dim=128,
                                                   page_size=page_size, dtype=torch.bfloat16)
    _poison_unowned(k, v, seqlens, table)
    config = dataclasses.replace(GLUON, gluon_block_n=block_n, gluon_persistent=persistent)
    _same_bytes_under(monkeypatch, "SCALAR_PAGES", (False, True), case, config,
                      lambda launch, scalar: launch._constexprs["SCALAR_PAGES"]
                      == (scalar and page_size < block_n))


@hopper_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("page_size,block_n", [(16, 128), (32, 64), (16, 64), (64, 128),
                                               (256, 128)])
def test_gluon_prefill_v_pages(monkeypatch, dtype, persistent, page_size, block_n):
    """``V_PAGES``: V by pages (one copy a page through a 3-D descriptor, the slot read by P V
    through ``v_pages_layout``, the last tile zeroed through it) gives V as K's bytes, cache
    slots no sequence owns NaN; tiles of one box keep V as K."""
    case = q, k, v, cu, seqlens, table = make_case(LENS, nheads=32, nheads_k=8, head_dim=128,
                                                   page_size=page_size, dtype=dtype)
    _poison_unowned(k, v, seqlens, table)
    config = dataclasses.replace(GLUON, gluon_block_n=block_n, gluon_persistent=persistent)
    _same_bytes_under(monkeypatch, "V_PAGES", (False, True), case, config,
                      lambda launch, on: launch.v_pages == (on and page_size < block_n))


@hopper_only
@pytest.mark.parametrize("v_pages", [False, True])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("page_size,block_n", [(16, 128), (32, 64), (256, 128)])
def test_gluon_prefill_kv_paired(monkeypatch, v_pages, persistent, page_size, block_n):
    """``KV_PAIRED``: a tile's K and V copies issued together, one page-id lookup a box for
    both, give K's copies then V's bytes (cache slots no sequence owns NaN); tiles of one box
    keep the vector form."""
    case = q, k, v, cu, seqlens, table = make_case(LENS, nheads=32, nheads_k=8, head_dim=128,
                                                   page_size=page_size, dtype=torch.bfloat16)
    _poison_unowned(k, v, seqlens, table)
    monkeypatch.setattr(gluon_prefill, "V_PAGES", v_pages)
    config = dataclasses.replace(GLUON, gluon_block_n=block_n, gluon_persistent=persistent)
    _same_bytes_under(monkeypatch, "KV_PAIRED", (False, True), case, config,
                      lambda launch, on: launch._constexprs["KV_PAIRED"]
                      == (on and page_size < block_n))


@pytest.mark.parametrize("block_n,head_dim,box", [(128, 128, 16), (128, 128, 32), (128, 128, 8),
                                                  (64, 128, 16), (128, 256, 16), (128, 128, 64)])
def test_v_pages_layout_is_where_the_copies_put_v(block_n, head_dim, box):
    """``v_pages_layout`` (CPU): every shared-memory offset of a V slot maps to the (key, column)
    that the page's TMA copy puts there: page-major, each page ``[head_dim / 64, box, 64]``,
    128-byte rows whose 16-byte chunks are swizzled by the row's index mod 8."""
    bases = gluon_prefill.v_pages_layout(block_n, head_dim, box).offset_bases
    assert len(bases) == (block_n * head_dim).bit_length() - 1
    chunks = head_dim // 64
    seen = set()
    for offset in range(block_n * head_dim):
        key = col = 0
        for bit, (dk, dc) in enumerate(bases):
            if offset >> bit & 1:
                key ^= dk
                col ^= dc
        page, row = divmod(key, box)
        chunk, c = divmod(col, 64)
        swizzled = ((c >> 3) ^ (row % 8)) * 8 + (c & 7)
        assert offset == ((page * chunks + chunk) * box + row) * 64 + swizzled
        seen.add((key, col))
    assert len(seen) == block_n * head_dim


@hopper_only
@pytest.mark.parametrize("box_rows", [16, 64])
def test_gluon_prefill_box_rows_probe(monkeypatch, box_rows):
    """``BOX_ROWS`` (a probe): boxes of fewer rows than a page (several boxes a page, each its
    own lookup) give the page-sized boxes' bytes."""
    case = q, k, v, cu, seqlens, table = make_case(LENS, nheads=32, nheads_k=8, head_dim=128,
                                                   page_size=256, dtype=torch.bfloat16)
    _poison_unowned(k, v, seqlens, table)
    # (16-row boxes would also take P's row sums by the tensor core: one form for both)
    monkeypatch.setattr(gluon_prefill, "ROW_SUM_MMA", False)
    config = dataclasses.replace(GLUON, gluon_block_n=128, gluon_persistent=True)
    _same_bytes_under(monkeypatch, "BOX_ROWS", (None, box_rows), case, config,
                      lambda launch, rows: launch.box == (rows or 128))


@hopper_only
@pytest.mark.parametrize("persistent", [False, True])
def test_gluon_prefill_tile_lookup_probe(monkeypatch, persistent):
    """``PROBE_TILE_LOOKUP`` (a probe): one block-table lookup a tile (True) or a sequence
    ("sequence") gives the per-box lookups' bytes where each sequence's pages are consecutive,
    its one precondition."""
    q, k, v, cu, seqlens, table = make_case(LENS, nheads=32, nheads_k=8, head_dim=128,
                                            page_size=16, dtype=torch.bfloat16)
    pages = -(-seqlens.long() // 16)
    first = torch.cumsum(pages, 0) - pages
    columns = torch.arange(table.shape[1], device=table.device)
    table = torch.where(columns < pages[:, None], first[:, None] + columns, 0).to(torch.int32)
    config = dataclasses.replace(GLUON, gluon_block_n=128, gluon_persistent=persistent)
    _same_bytes_under(monkeypatch, "PROBE_TILE_LOOKUP", (False, True, "sequence"),
                      (q, k, v, cu, seqlens, table), config,
                      lambda launch, probe: launch._constexprs["TILE_LOOKUP"]
                      == {False: 0, True: 1, "sequence": 2}[probe])


@hopper_only
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_gluon_prefill_runtime_page_probe(monkeypatch, page_size):
    """``PROBE_RUNTIME_PAGE`` (a probe): the page size as a kernel argument (``PAGE_SIZE`` 0)
    gives the constant's bytes, pages in random order."""
    case = q, k, v, cu, seqlens, table = make_case(LENS, nheads=32, nheads_k=8, head_dim=128,
                                                   page_size=page_size, dtype=torch.bfloat16)
    _poison_unowned(k, v, seqlens, table)
    monkeypatch.setattr(gluon_prefill, "BOX_ROWS", 16)   # several boxes a page at page 256
    config = dataclasses.replace(GLUON, gluon_block_n=128, gluon_persistent=True)
    _same_bytes_under(monkeypatch, "PROBE_RUNTIME_PAGE", (False, True), case, config,
                      lambda launch, probe: launch._constexprs["PAGE_SIZE"]
                      == (0 if probe else page_size))


@hopper_only
@pytest.mark.parametrize("probe", ["no_exp", "no_rescale"])
def test_gluon_prefill_softmax_probe(monkeypatch, probe):
    """``PROBE_SOFTMAX`` (a timing probe, wrong outputs by design): its launch carries the
    probe, and its output differs from the kernel's (the probe is live), while the kernel's own
    launch is unchanged by it having run."""
    q, k, v, cu, seqlens, table = make_case([(1000, 1000), (300, 2100)], nheads=32, nheads_k=8,
                                            head_dim=128, page_size=16, dtype=torch.bfloat16)
    config = dataclasses.replace(GLUON, gluon_block_n=128, gluon_persistent=True)
    outs = []
    for value in (None, probe, None):
        monkeypatch.setattr(gluon_prefill, "PROBE_SOFTMAX", value)
        plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                       causal=True, config=config)
        outs.append(plan.run(q, k, v, cu, seqlens, table))
        probe_form = 0 if value is None else {"no_exp": 1, "no_rescale": 2}[value]
        # (P's row sums by the tensor core at page 16's boxes, not with a probe)
        sum_mma = value is None and gluon_prefill.row_sum_mma(16)
        assert all(launch._gluon._constexprs["SOFTMAX_FORM"]
                   == probe_form + 8 * gluon_prefill.ROW_TREE + 64 * sum_mma
                   for launch in plan._launches.values())
    assert not torch.equal(outs[1], outs[0])
    assert torch.equal(outs[2], outs[0])


@hopper_only
def test_gluon_prefill_trace_probe(monkeypatch):
    """``PROBE_TRACE`` (a probe, scripts/prefill_item_trace.py): the traced kernel gives the
    untraced bytes, and every item a consumer warpgroup ran left its steps' clocks in order and
    its key tiles."""
    case = q, k, v, cu, seqlens, table = make_case(LENS, nheads=32, nheads_k=8, head_dim=128,
                                                   page_size=16, dtype=torch.bfloat16)
    _poison_unowned(k, v, seqlens, table)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    trace = torch.full((sms, gluon_prefill.TRACE_ROUNDS.value, 2,
                        gluon_prefill.TRACE_EVENTS.value), -1, dtype=torch.int64,
                       device=q.device)
    # (the traced kernel keeps the row sums by FADDs, with them P @ ones spills in its loop)
    monkeypatch.setattr(gluon_prefill, "ROW_SUM_MMA", False)
    config = dataclasses.replace(GLUON, gluon_block_n=128, gluon_persistent=True)
    _same_bytes_under(monkeypatch, "PROBE_TRACE", (None, trace), case, config,
                      lambda launch, buf: launch._constexprs["TRACE"] == (buf is not None))
    stamps = trace[trace[..., 0] >= 0]            # [items run x 2 warpgroups, events]
    assert stamps.shape[0] > 0
    assert bool((stamps[:, 1:6] >= stamps[:, 0:5]).all())
    assert bool((stamps[:, 6] >= 1).all())        # an item that runs has a key tile
    # cycles waited in the loop: none without a loop, and within its span
    assert bool((stamps[:, 7:9] >= 0).all())
    assert bool((stamps[:, 7:9].sum(1) <= stamps[:, 3] - stamps[:, 2]).all())
    # the loop's steps: each >= 0, together within its span, the waits inside the issue step
    assert bool((stamps[:, 12:17] >= 0).all())
    assert bool((stamps[:, 12:17].sum(1) <= stamps[:, 3] - stamps[:, 2]).all())
    assert bool((stamps[:, 7:9].sum(1) <= stamps[:, 12]).all())
    # the switch's stamps in order: loop end <= V landed <= P V issued <= lookup <= P V retired
    for a, b in ((3, 10), (10, 11), (11, 9), (9, 4)):
        assert bool((stamps[:, b] >= stamps[:, a]).all())
    # the softmax stamps of the loop's first tiles: start <= end <= next start, inside the loop,
    # written for exactly the loop's tiles (up to TRACE_TILES)
    tiles = gluon_prefill.TRACE_TILES.value
    for row in stamps.tolist():
        k = min(row[6] - 1, tiles)
        marks = row[17:17 + 2 * k]
        assert marks == sorted(marks)
        assert not marks or (marks[0] >= row[2] and marks[-1] <= row[3])
        assert all(x == -1 for x in row[17 + 2 * k:17 + 2 * tiles])


@hopper_only
@pytest.mark.parametrize("nheads,nheads_k,head_dim", [(12, 2, 128), (28, 4, 128), (40, 8, 64)])
def test_gluon_prefill_padded_groups(nheads, nheads_k, head_dim):
    """Groups that do not divide the 128 rows (6, 7, 5): BLOCK_Q * GROUP rows and padding."""
    q, k, v, cu, seqlens, table = make_case(LENS, nheads=nheads, nheads_k=nheads_k,
                                            head_dim=head_dim, dtype=torch.bfloat16)
    ref, ref_lse = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                                     causal=True)
    _poison_unowned(k, v, seqlens, table)
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                   config=GLUON)
    with poison_empty:
        out, lse = plan.run(q, k, v, cu, seqlens, table, return_lse=True)
    assert _launch_is_gluon(plan)
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    check_lse(lse, ref_lse)


@hopper_only
def test_gluon_prefill_cached_launch(monkeypatch):
    """``CACHED_LAUNCH``: the compiled kernel's launcher with the TMA descriptors as plain
    arguments gives the JIT launch's bytes, on the first call (which compiles through the JIT)
    and the next ones (cached), also for new lengths and queries of the same shapes."""
    q, k, v, cu, seqlens, table = make_case(LENS, nheads=32, nheads_k=8, head_dim=128,
                                            dtype=torch.bfloat16)
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                   config=GLUON)
    monkeypatch.setattr(gluon_prefill, "CACHED_LAUNCH", False)
    want = plan.run(q, k, v, cu, seqlens, table, return_lse=True)
    monkeypatch.setattr(gluon_prefill, "CACHED_LAUNCH", True)
    cached = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                     config=GLUON)
    for _ in range(3):
        got = cached.run(q, k, v, cu, seqlens, table, return_lse=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    q2 = torch.randn_like(q)
    seqlens2 = seqlens + 7
    ref, _ = paged_prefill_ref(q2.float(), k.float(), v.float(), cu, seqlens2, table,
                               causal=True)
    assert rel_err(cached.run(q2, k, v, cu, seqlens2, table), ref) < TOL[torch.bfloat16]


@hopper_only
def test_gluon_prefill_strided_q_and_graph_replay():
    """q as a view with a token stride past its heads (a fused qkv projection's q part), run
    inside a CUDA graph and replayed on new values."""
    q_all, k, v, cu, seqlens, table = make_case(LENS, nheads=48, nheads_k=8, head_dim=128,
                                                page_size=16, dtype=torch.bfloat16)
    q = q_all[:, :32]
    plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=max_q(cu),
                                   config=GLUON)
    out = plan.run(q, k, v, cu, seqlens, table)
    assert _launch_is_gluon(plan)
    ref, _ = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table, causal=True)
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = plan.run(q, k, v, cu, seqlens, table)
    q_all.copy_(torch.randn_like(q_all))
    graph.replay()
    ref, _ = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table, causal=True)
    assert rel_err(captured, ref) < TOL[torch.bfloat16]


def test_unsupported_arguments_take_the_triton_kernel():
    """What the Gluon kernel does not cover is named, and the plan then runs the Triton kernel
    (a quantized cache, a GQA group over 128 heads, head dim 96, a CPU tensor)."""
    q, k, v, cu, seqlens, table = (t.cpu() for t in make_case([(3, 20)], nheads=4, nheads_k=2))
    reason = gluon_prefill.unsupported_reason
    assert "Hopper" in reason(q, k, v, table, kv_format=0, block_n=128, stages=2)
    assert "quantized" in reason(q, k, v, table, kv_format=2, block_n=128, stages=2)
    if HOPPER:
        q, k, v, cu, seqlens, table = make_case([(3, 40)], nheads=136, nheads_k=1, head_dim=128,
                                                dtype=torch.bfloat16)
        assert "group" in reason(q, k, v, table, kv_format=0, block_n=128, stages=2)
        q, k, v, cu, seqlens, table = make_case([(3, 40)], nheads=4, nheads_k=2, head_dim=96,
                                                dtype=torch.bfloat16)
        assert "head_dim" in reason(q, k, v, table, kv_format=0, block_n=128, stages=2)
        plan = kvonce.PagedPrefillPlan(q, k, v, cu, seqlens, table, max_seqlen_q=3,
                                       config=GLUON)
        out = plan.run(q, k, v, cu, seqlens, table)
        assert not _launch_is_gluon(plan)
        ref, _ = paged_prefill_ref(q.float(), k.float(), v.float(), cu, seqlens, table,
                                   causal=True)
        assert rel_err(out, ref) < TOL[torch.bfloat16]
