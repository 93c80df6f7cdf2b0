"""The decode's batch cut (``kvonce.paged.batch_cut``, ``splits.gluon_batch_cut`` and
``splits.triton_batch_cut``): the first sequences in one pass, the rest split, two launches over
batch slices (on Hopper the second a programmatic dependent of the first).

The rules are checked on the CPU (shapes only). The launches are checked under the Triton
interpreter (or on a GPU) through the Triton decode, the plan's ``batch_cut`` set by hand or by
its rule on a row made for the CPU's one SM; the Gluon cut and the Triton cut at the measured
row on an sm_90 GPU."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import poison_empty
from test_decode import LSE_TOL, TOL, lse_err, make_paged, make_q, rel_err

import kvonce
from kvonce.kernels.configs import interpreter_active
from kvonce.paged import splits
from kvonce.paged.batch_cut import BatchCutLaunch
from kvonce.reference import paged_attention_ref

CUDA = torch.cuda.is_available()
runs_kernels = pytest.mark.skipif(not CUDA and not interpreter_active(),
                                  reason="needs a CUDA GPU or TRITON_INTERPRET=1")


def test_gluon_batch_cut_rule(monkeypatch):
    """A cut only where one pass leaves its last wave ragged, at the whole waves' last
    sequence, the tail at the short-launch split rule's count; none with the switch off."""
    monkeypatch.setattr(splits, "GLUON_BATCH_CUT", False)
    assert splits.gluon_batch_cut(68, 8, 8192, 132) == (0, 0)
    monkeypatch.setattr(splits, "GLUON_BATCH_CUT", True)
    # GQA 32/8 x 8192 keys on 132 SMs (a wave: 264 CTAs, 33 sequences): 68 sequences are 2.06
    # waves -> 66 whole, 2 left (16 CTAs) at 8 splits; 72 -> 66 whole, 6 left (48) at 5
    assert splits.gluon_batch_cut(68, 8, 8192, 132) == (66, 8)
    assert splits.gluon_batch_cut(72, 8, 8192, 132) == (66, 5)
    assert splits.gluon_batch_cut(64, 8, 8192, 132) == (0, 0)        # 1.94 waves: fill 0.97
    assert splits.gluon_batch_cut(66, 8, 8192, 132) == (0, 0)        # two whole waves
    assert splits.gluon_batch_cut(20, 8, 8192, 132) == (0, 0)        # under one wave
    assert splits.gluon_batch_cut(68, 8, 8192, 132, True)[0] == 66   # int4 (two CTAs an SM)
    monkeypatch.setattr(splits, "GLUON_INT4_BATCH_CUT", False)
    assert splits.gluon_batch_cut(68, 8, 8192, 132, True) == (0, 0)
    for batch in range(34, 200):
        for cps in (1, 2, 4, 8, 12):
            whole, tail_splits = splits.gluon_batch_cut(batch, cps, 8192, 132)
            if not whole:
                continue
            assert 0 < whole < batch and whole * cps <= batch * cps - (batch * cps) % 264
            assert whole * cps % 264 < cps                            # whole waves, to a sequence
            assert tail_splits == splits.gluon_num_splits((batch - whole) * cps, 8192, 132) > 1


@runs_kernels
@pytest.mark.parametrize("fmt", [None, "int8"])
@pytest.mark.parametrize("return_lse", [True, False])
def test_batch_cut_plan_matches_reference(fmt, return_lse):
    """A plan run cut after its second sequence (one pass for sequences 0-1, three splits for
    2-4) equals the reference: empty sequences on both sides, lengths off the tile grid, GQA,
    two query rows, causal; every output element written (NaN-poisoned)."""
    dtype = torch.float32 if fmt is None else torch.float16
    lens = [37, 0, 90, 0, 51]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=2, head_dim=32,
                                                  dtype=dtype)
    q = make_q(len(lens), 2, 4, 32, dtype)
    kw, kd, vd = {}, k_cache, v_cache
    if fmt is not None:
        (k_cache, ks), (v_cache, vs) = (kvonce.quantize_kv(t, fmt) for t in (k_cache, v_cache))
        kd, vd = (kvonce.dequantize_kv(t, s, fmt, dtype=torch.float32)
                  for t, s in ((k_cache, ks), (v_cache, vs)))
        kw = dict(k_scale=ks, v_scale=vs)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=3, **kw)
    plan.batch_cut = 2       # before the first run: the launches bind then
    with poison_empty:
        got = plan.run(q, k_cache, v_cache, seqlens, table, return_lse=return_lse, **kw)
    assert all(isinstance(launch, BatchCutLaunch) for launch in plan._launches.values())
    ref_o, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    out = got[0] if return_lse else got
    assert rel_err(out, ref_o) < TOL[dtype] * (1 if fmt is None else 2)
    if return_lse:
        assert lse_err(got[1], ref_lse) < LSE_TOL
    # the same plan again, other values: the cut launches are reused
    q2 = make_q(len(lens), 2, 4, 32, dtype, seed=5)
    out2 = plan.run(q2, k_cache, v_cache, seqlens, table, **kw)
    ref2, _ = paged_attention_ref(q2.float(), kd, vd, seqlens, table)
    assert rel_err(out2, ref2) < TOL[dtype] * (1 if fmt is None else 2)


@runs_kernels
def test_batch_cut_reaches_the_custom_op():
    """Under ``torch.compile`` the plan calls ``kvonce::paged_decode_split`` with its cut (a
    launch field), which cuts the same way as eager."""
    dtype = torch.float32
    lens = [20, 33, 5, 48]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=2, head_dim=32,
                                                  dtype=dtype)
    q = make_q(len(lens), 1, 4, 32, dtype)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=2)
    plan.batch_cut = 3
    eager = plan.run(q, k_cache, v_cache, seqlens, table, return_lse=True)
    torch._dynamo.reset()
    step = torch.compile(lambda *t: plan.run(*t, return_lse=True), fullgraph=True,
                         backend="aot_eager")
    compiled = step(q, k_cache, v_cache, seqlens, table)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ref_o, _ = paged_attention_ref(q, k_cache, v_cache, seqlens, table)
    assert rel_err(eager[0], ref_o) < TOL[dtype]



@runs_kernels
def test_opcheck_with_a_batch_cut():
    """``kvonce::paged_decode_split`` with ``batch_cut`` (its last launch field): schema,
    declared mutations, fake shapes."""
    lens = [20, 0, 5, 48]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=2, head_dim=32,
                                                  dtype=torch.float32)
    q = make_q(len(lens), 1, 4, 32, torch.float32)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=2)
    c = plan.config
    fields = (plan.softmax_scale, True, c.block_n, c.num_warps, c.num_stages,
              c.kv_cache_modifier, c.kv_eviction, c.max_merged_splits, None, None, 0,
              c.max_registers, c.swap_ab, c.f16_math, c.int64_kv_offsets, c.v_pairs, None, None,
              c.prefetch_pages, c.head_pairs, False, 2)
    torch.library.opcheck(torch.ops.kvonce.paged_decode_split,
                          (q, k_cache, v_cache, seqlens, table, *plan._scratch(), *fields))

HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not HOPPER, reason="the Gluon decode needs an sm_90 GPU")
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8", "int4"])
def test_gluon_plan_takes_the_cut_where_one_pass_is_ragged(fmt, overlap, q_len, monkeypatch):
    """GQA 32/8 x 8192 keys at 35 sequences (280 CTAs: 1.06 waves of two an SM on 132 SMs)
    with the rule on: 33 sequences in one pass, two at 8 splits, on the Gluon decode, the tail
    a programmatic dependent of the head (``overlap``) or after it; equal to the dequantized
    reference (causal: q_len 2 sees its own keys bottom-right), with an empty and an off-grid
    sequence in each part, eager and in a graph (whose replay is read at once: a tail that
    ended before its head would leave the head's rows of the eager run's queries)."""
    from test_gluon_decode import KV_FORMATS, ROWS, _case

    from kvonce.paged import batch_cut

    monkeypatch.setattr(splits, "GLUON_BATCH_CUT", True)
    monkeypatch.setattr(batch_cut, "OVERLAP", overlap)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch = (2 * num_sms) // 8 + 2
    lens = [8192] * batch
    lens[3], lens[5], lens[-1], lens[-2] = 0, 1000, 0, 7999
    q, kq, vq, ks, vs, seqlens, table, kd, vd = _case(fmt, batch, q_len, 32, 8, 16, lens, 8192)
    plan = kvonce.PagedDecodePlan(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs,
                                  config=ROWS[fmt], kv_format=KV_FORMATS.get(fmt))
    assert plan.uses_gluon and plan.batch_cut == batch - 2 and plan.num_splits > 1
    with poison_empty:
        out, lse = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs, return_lse=True)
    launch, = plan._launches.values()
    assert launch.tail.constexprs["PDL_EXIT_WAIT"] == overlap
    assert launch.head.constexprs["PDL_TRIGGER"] == overlap
    ref_o, ref_lse = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    assert rel_err(out, ref_o) < 2e-3
    assert lse_err(lse, ref_lse) < LSE_TOL
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = plan.run(q, kq, vq, seqlens, table, k_scale=ks, v_scale=vs)
    q.copy_(torch.randn_like(q))
    graph.replay()
    ref2, _ = paged_attention_ref(q.float(), kd, vd, seqlens, table)
    assert rel_err(captured, ref2) < 2e-3


def test_triton_batch_cut_rule(monkeypatch):
    """The Triton decode's cut: only where its row names the programs an SM holds and the one
    pass's last wave of them is ragged; the tail at ``choose_num_splits``' count for it."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE

    row = _PAGED_DECODE_TABLE[(9, 0)][128]          # resident_programs_per_sm 4
    monkeypatch.setattr(splits, "TRITON_BATCH_CUT", False)
    assert splits.triton_batch_cut(68, 8, 8192, 132, row) == (0, 0)
    monkeypatch.setattr(splits, "TRITON_BATCH_CUT", True)
    # GQA 32/8 x 8192 keys on 132 SMs: a wave 528 programs (66 sequences)
    whole, tail = splits.triton_batch_cut(68, 8, 8192, 132, row)
    assert whole == 66
    assert tail == splits.busy_splits(8192, splits.choose_num_splits(2, 8, 8192, 132, row),
                                      row.block_n) > 1
    assert splits.triton_batch_cut(64, 8, 8192, 132, row) == (0, 0)      # 0.97 of a wave
    assert splits.triton_batch_cut(66, 8, 8192, 132, row) == (0, 0)      # one whole wave
    assert splits.triton_batch_cut(40, 8, 8192, 132, row) == (0, 0)      # under one
    assert splits.triton_batch_cut(45, 12, 8192, 132, row)[0] == 44      # MHA 12/12
    assert splits.triton_batch_cut(72, 8, 8192, 132, row)[0] == 66       # a tail of 48
    assert splits.triton_batch_cut(50, 12, 8192, 132, row) == (0, 0)     # of 72: past 0.1
    no_count = dataclasses.replace(row, resident_programs_per_sm=0)
    assert splits.triton_batch_cut(68, 8, 8192, 132, no_count) == (0, 0)
    for batch in range(67, 300):
        whole, tail = splits.triton_batch_cut(batch, 8, 8192, 132, row)
        if whole:
            assert whole * 8 % 528 == 0 and 0 < whole < batch and tail > 1
            assert (batch - whole) * 8 <= 52.8


@pytest.mark.skipif(CUDA or not interpreter_active(),
                    reason="a CPU plan (one SM) under the interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_plan_takes_its_cut(dtype, monkeypatch):
    """A plan on the Triton decode whose row names 16 programs an SM (on the CPU's one SM) at
    17 sequences: 16 in one pass, the last at 4 splits; equal to the reference (empty and
    off-grid sequences, GQA, NaN-poisoned outputs), and the same again with other queries."""
    from kvonce.kernels.configs import _PAGED_DECODE_INTERPRETER

    monkeypatch.setattr(splits, "TRITON_BATCH_CUT", True)
    config = dataclasses.replace(_PAGED_DECODE_INTERPRETER, resident_programs_per_sm=16,
                                 programs_per_sm=4.0, slow_programs_per_sm=(100.0, 100.0))
    lens = [37, 0, 90, 51, 70, 3, 16, 17, 0, 44, 9, 28, 60, 1, 33, 75, 66]
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=1, head_dim=32,
                                                  dtype=dtype)
    q = make_q(len(lens), 1, 4, 32, dtype)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, config=config)
    assert plan.batch_cut == 16 and plan.num_splits == 4
    ref_o, ref_lse = paged_attention_ref(q.float(), k_cache.float(), v_cache.float(), seqlens,
                                         table)
    with poison_empty:
        out, lse = plan.run(q, k_cache, v_cache, seqlens, table, return_lse=True)
    assert all(isinstance(launch, BatchCutLaunch) for launch in plan._launches.values())
    assert rel_err(out, ref_o) < TOL[dtype]
    assert lse_err(lse, ref_lse) < LSE_TOL
    q2 = make_q(len(lens), 1, 4, 32, dtype, seed=7)
    ref2, _ = paged_attention_ref(q2.float(), k_cache.float(), v_cache.float(), seqlens, table)
    assert rel_err(plan.run(q2, k_cache, v_cache, seqlens, table), ref2) < TOL[dtype]


@pytest.mark.skipif(not HOPPER, reason="the measured row is sm_90's")
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("q_dtype", [torch.float16, torch.bfloat16])
def test_triton_plan_cut_on_the_gpu(q_dtype, overlap, monkeypatch):
    """GQA 32/8 x 8192 keys at two sequences past a wave of the d128 row's 4 programs an SM: the
    Triton decode's cut (its tail a programmatic dependent of its head, ``overlap``, or after
    it), equal to the reference with empty and off-grid sequences in both parts, eager and in a
    graph read at once after its replay."""
    from kvonce.paged import batch_cut

    monkeypatch.setattr(splits, "TRITON_BATCH_CUT", True)
    monkeypatch.setattr(batch_cut, "OVERLAP", overlap)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch = 4 * num_sms // 8 + 2
    lens = [8192] * batch
    lens[3], lens[5], lens[-1], lens[-2] = 0, 1000, 0, 7999
    k_cache, v_cache, seqlens, table = make_paged(lens, page_size=16, nheads_k=8,
                                                  head_dim=128, dtype=q_dtype, spare_pages=0)
    q = make_q(batch, 1, 32, 128, q_dtype)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table)
    assert not plan.uses_gluon and plan.batch_cut == batch - 2 and plan.num_splits > 1
    with poison_empty:
        out, lse = plan.run(q, k_cache, v_cache, seqlens, table, return_lse=True)
    launch, = plan._launches.values()
    assert launch.tail._constexprs["PDL_EXIT_WAIT"] == overlap
    ref_o, ref_lse = paged_attention_ref(q.float(), k_cache.float(), v_cache.float(), seqlens,
                                         table)
    assert rel_err(out, ref_o) < TOL[q_dtype]
    assert lse_err(lse, ref_lse) < LSE_TOL
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = plan.run(q, k_cache, v_cache, seqlens, table)
    q.copy_(torch.randn_like(q))
    graph.replay()
    ref2, _ = paged_attention_ref(q.float(), k_cache.float(), v_cache.float(), seqlens, table)
    assert rel_err(captured, ref2) < TOL[q_dtype]
