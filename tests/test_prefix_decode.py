"""Shared-prefix decode (kvonce.paged.prefix, kernels/prefix_decode.py) against plain paged decode
over the same block table and the float32 reference.

The cascade is forced on (``cascade=True``): small shapes would otherwise pick plain decode and
leave it untested. Plans and runs are built under ``poison_empty``: every kernel output and
scratch buffer is allocated NaN-filled, so an element the kernels fail to write shows up as a NaN.
On CPU under the Triton interpreter: tiny shapes (head dim 32/64, a few pages); GPU-only tests
(bf16, real sizes, CUDA graphs) are marked.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DEVICE, HAS_CUDA, poison_empty

import kvonce
import kvonce.paged.prefix as prefix
import kvonce.paged.prefix_tree as tree
from kvonce.kernels.configs import PrefixDecodeConfig, interpreter_active
from kvonce.reference import paged_attention_ref

pytestmark = pytest.mark.skipif(not HAS_CUDA and not interpreter_active(),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")
gpu_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (bf16, real sizes, graphs)")
TOL = {torch.float32: 2e-3 if HAS_CUDA else 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LSE_TOL = 5e-3 if HAS_CUDA else 1e-3
# Cascade vs plain decode: the same math in another order (partials merged in float32).
PLAIN_TOL = {torch.float32: 1e-3 if HAS_CUDA else 2e-5, torch.float16: 2e-3,
             torch.bfloat16: 1.6e-2}


def rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float().to(out.device)
    assert not torch.isnan(out).any(), "output has NaNs (an element was not written)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def lse_err(lse, ref) -> float:
    assert not torch.isnan(lse).any(), "lse has NaNs (an element was not written)"
    ref = ref.to(lse.device)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "-inf rows differ"
    finite = torch.isfinite(ref)
    return (lse[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0


# ------------------------------------------------------------------------------------------------
# Inputs: random prefix trees over a paged cache with pages in random physical order
# ------------------------------------------------------------------------------------------------

def random_tree(seed: int, batch: int, page_size: int, *, max_run: int = 3, max_depth: int = 3,
                max_own: int = 2):
    """Rows of page ids built as a random tree of shared runs (nested groups, singletons, runs of
    1..max_run pages), then 0..max_own own pages per sequence; lengths end inside the last own
    page, or exactly at the end of the shared run for sequences with no own page. Returns
    (block_table int32 [batch, max_pages] on the CPU, seqlens list, groups [(members, pages)])."""
    rng = np.random.default_rng(seed)
    rows = [[] for _ in range(batch)]
    groups = []
    counter = [0]

    def pages(n):
        counter[0] += n
        return list(range(counter[0] - n, counter[0]))

    def grow(members, depth):
        run = pages(int(rng.integers(1, max_run + 1)))
        for b in members:
            rows[b].extend(run)
        groups.append((sorted(members), len(rows[members[0]])))
        if depth < max_depth:
            for part in _random_parts(rng, members, max_cuts=2):
                if len(part) >= 2 and rng.random() < 0.85:
                    grow(part, depth + 1)

    for part in _random_parts(rng, list(range(batch)), max_cuts=1):
        if len(part) >= 2:
            grow(part, 0)
    lens = []
    for b in range(batch):
        own = int(rng.integers(0 if rows[b] else 1, max_own + 1))
        shared = len(rows[b]) * page_size
        rows[b].extend(pages(own))
        lens.append(shared if own == 0 else shared + int(rng.integers(1, own * page_size + 1)))
    num_pages = counter[0] + 2
    perm = rng.permutation(num_pages)
    width = max(len(r) for r in rows) + 1  # a spare column, padded with page 0
    table = torch.zeros((batch, width), dtype=torch.int32)
    for b, r in enumerate(rows):
        table[b, :len(r)] = torch.from_numpy(perm[r].astype(np.int32))
    return table, lens, groups, num_pages


def _random_parts(rng, members, max_cuts):
    """``members`` cut at 0..max_cuts random places (0 cuts: the group goes on as a whole)."""
    perm = [int(x) for x in rng.permutation(members)]
    n_cuts = min(len(perm) - 1, int(rng.integers(0, max_cuts + 1)))
    cuts = sorted(rng.choice(np.arange(1, len(perm)), size=n_cuts, replace=False)) if n_cuts else []
    return [sorted(p) for p in np.split(np.array(perm, dtype=int), cuts) if len(p)]


def make_inputs(table, lens, num_pages, *, q_len, nheads, nheads_k, head_dim, page_size, dtype,
                seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (num_pages, page_size, nheads_k, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=g).to(dtype).to(DEVICE)
    q = torch.randn((len(lens), q_len, nheads, head_dim), generator=g).to(dtype).to(DEVICE)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return q, k_cache, v_cache, seqlens, table.to(DEVICE)


def check_against_plain(q, k_cache, v_cache, seqlens, table, *, causal=True, **plan_kw):
    """The forced cascade equals plain decode (and the reference); returns the plan."""
    with poison_empty:
        plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, causal=causal,
                                      cascade=True, **plan_kw)
        out, lse = plan.run(q, k_cache, v_cache, seqlens, table, return_lse=True)
        plain, plain_lse = kvonce.paged_attention(q, k_cache, v_cache, seqlens, table,
                                                  causal=causal, return_lse=True)
    assert plan.uses_cascade
    ref, ref_lse = paged_attention_ref(q, k_cache, v_cache, seqlens, table, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == plain_lse.shape
    assert rel_err(out, plain) < PLAIN_TOL[q.dtype], f"vs plain decode: {rel_err(out, plain):.2e}"
    assert rel_err(out, ref) < TOL[q.dtype], f"vs reference: {rel_err(out, ref):.2e}"
    assert lse_err(lse, ref_lse) < LSE_TOL
    assert lse_err(lse, plain_lse) < LSE_TOL
    return plan


# ------------------------------------------------------------------------------------------------
# The cascade equals plain decode
# ------------------------------------------------------------------------------------------------

# (seed, batch, page size, nheads, nheads_k, head dim, q_len, causal, dtype)
RANDOM_CASES = [
    (0, 6, 16, 4, 4, 32, 1, True, torch.float16),     # MHA
    (1, 5, 16, 8, 2, 64, 2, True, torch.float16),     # GQA 4
    (2, 6, 32, 8, 1, 32, 1, True, torch.float32),     # GQA 8 / MQA, 32-token pages
    (3, 4, 16, 6, 3, 32, 3, True, torch.float16),     # GQA 2, q_len 3
    (4, 5, 16, 8, 8, 32, 4, False, torch.float16),    # MHA, q_len 4, not causal
    (5, 4, 32, 4, 1, 64, 2, False, torch.float32),    # GQA 4 / MQA, not causal
    (6, 7, 16, 2, 2, 32, 1, True, torch.float32),     # more sequences, deeper trees
    (7, 5, 16, 4, 2, 96, 2, True, torch.float16),     # head dim 96: a masked head dim
]


@pytest.mark.parametrize("seed,batch,page_size,nheads,nheads_k,head_dim,q_len,causal,dtype",
                         RANDOM_CASES)
def test_random_trees_equal_plain_decode(seed, batch, page_size, nheads, nheads_k, head_dim,
                                         q_len, causal, dtype):
    table, lens, groups, num_pages = random_tree(seed, batch, page_size)
    inputs = make_inputs(table, lens, num_pages, q_len=q_len, nheads=nheads, nheads_k=nheads_k,
                         head_dim=head_dim, page_size=page_size, dtype=dtype, seed=seed)
    plan = check_against_plain(*inputs, causal=causal, shared_prefix="auto")
    assert plan._cascade.nodes, "the random tree has no shared run"
    # The caller's tree (as built; may split one run in two nodes) gives the same result.
    given = [(torch.tensor(m, dtype=torch.int32), n) for m, n in groups]
    check_against_plain(*inputs, causal=causal, shared_prefix=given, check_block_table=True)


def test_no_own_pages_q_len_above_one_masks_inside_the_shared_run():
    """Every sequence ends exactly at the end of the shared run: the causal diagonal of each of
    the q_len rows lies inside the shared pages (and one sequence is shorter than q_len)."""
    page = 16
    table = torch.tensor([[3, 5, 7, 0], [3, 5, 7, 0], [3, 5, 0, 0], [3, 0, 0, 0]],
                         dtype=torch.int32)
    lens = [48, 48, 32, 16]
    inputs = make_inputs(table, lens, 8, q_len=4, nheads=4, nheads_k=2, head_dim=32,
                         page_size=page, dtype=torch.float16)
    plan = check_against_plain(*inputs, shared_prefix="auto")
    assert [(n.members, n.lo, n.hi) for n in plan._cascade.nodes] == [
        ((0, 1, 2, 3), 0, 1), ((0, 1, 2), 1, 2), ((0, 1), 2, 3)]
    assert plan._cascade.suffix_seqlens.tolist() == [0, 0, 0, 0]


def test_group_longer_than_a_member():
    """A caller's group whose run passes some members' lengths (identical entries in columns
    they do not use): each row is cut at its own sequence's end, the suffix of such a member is
    empty, and rows that see no key at all (causal, q_len > length) come out 0 / -inf."""
    table = torch.tensor([[4, 6, 1, 3, 7], [4, 6, 1, 3, 0], [4, 6, 1, 3, 2]], dtype=torch.int32)
    lens = [70, 40, 2]
    inputs = make_inputs(table, lens, 8, q_len=4, nheads=4, nheads_k=2, head_dim=32,
                         page_size=16, dtype=torch.float32)
    plan = check_against_plain(*inputs, shared_prefix=[(torch.tensor([0, 1, 2],
                                                                     dtype=torch.int32), 4)])
    assert plan._cascade.suffix_seqlens.tolist() == [6, 0, 0]
    with poison_empty:
        out, lse = plan.run(*inputs, return_lse=True)
    assert torch.isneginf(lse[2, :, :2]).all() and (out[2, :2] == 0).all()


def test_key_chunks_and_suffix_splits(monkeypatch):
    """Shared runs cut into several key chunks per node (each its own partial slot) and a
    forced suffix split count: still plain decode's result."""
    many = PrefixDecodeConfig(32, 16, 4, 1, programs_per_sm=64.0, min_keys_per_split=16,
                              max_splits_per_node=4)
    monkeypatch.setattr(prefix, "get_prefix_decode_config", lambda *a: many)
    table, lens, _, num_pages = random_tree(11, 5, 16, max_run=4, max_depth=1)
    inputs = make_inputs(table, lens, num_pages, q_len=2, nheads=4, nheads_k=2, head_dim=32,
                         page_size=16, dtype=torch.float32)
    plan = check_against_plain(*inputs, shared_prefix="auto", num_splits=3)
    cascade = plan._cascade
    assert max(cascade.layout.splits) > 1 and cascade.suffix_splits == 3
    assert cascade.num_slots == 3 + max(b + s for b, s in zip(cascade.layout.slot_base,
                                                               cascade.layout.splits))


def test_int32_and_int64_offsets_agree(monkeypatch):
    """The chunk-first launch addresses K/V in int64 where its config sets
    ``int64_kv_offsets`` (the GPU rows) and in int32 otherwise, the suffix decode as its decode
    config says: the same bytes out either way, through the plan's launch and the custom op."""
    import dataclasses

    from kvonce.kernels.configs import get_paged_decode_config
    table, lens, _, num_pages = random_tree(3, 5, 16)
    inputs = make_inputs(table, lens, num_pages, q_len=2, nheads=4, nheads_k=2, head_dim=32,
                         page_size=16, dtype=torch.float16, seed=3)
    chunk, dec = prefix.get_prefix_decode_config(None, 32), get_paged_decode_config(None, 32)
    outs = []
    for wide in (False, True):
        monkeypatch.setattr(prefix, "get_prefix_decode_config",
                            lambda *a, w=wide: dataclasses.replace(chunk, int64_kv_offsets=w))
        plan = check_against_plain(*inputs, shared_prefix="auto", num_splits=2,
                                   config=dataclasses.replace(dec, int64_kv_offsets=wide))
        with poison_empty:
            outs.append(plan.run(*inputs))
        for launch in plan._cascade._launches.values():
            assert launch._chunk[4]["INT64_KV"] is wide
            assert launch._suffix[4]["INT64_KV"] is wide
        assert torch.equal(plan._cascade._run_op(*inputs)[0], outs[-1])
    assert torch.equal(outs[0], outs[1])


def test_plan_reused_across_layers_and_lengths():
    """One plan, several layers (new q, K/V values) and longer own suffixes (lengths read on the
    device): each run equals plain decode."""
    table, lens, _, num_pages = random_tree(21, 4, 16, max_depth=1)
    dtype = torch.float16
    q, k_cache, v_cache, seqlens, table = make_inputs(table, lens, num_pages, q_len=1, nheads=4,
                                                      nheads_k=2, head_dim=32, page_size=16,
                                                      dtype=dtype)
    with poison_empty:
        plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, shared_prefix="auto",
                                      cascade=True)
    for layer in range(2):
        q.normal_()
        k_cache.normal_()
        if layer == 1:  # one more token where a sequence has room in its table
            room = table.shape[1] * 16
            seqlens.copy_(torch.clamp(seqlens + 1, max=room))
        with poison_empty:
            out = plan.run(q, k_cache, v_cache, seqlens, table)
            plain = kvonce.paged_attention(q, k_cache, v_cache, seqlens, table)
        assert rel_err(out, plain) < PLAIN_TOL[dtype]
    with pytest.raises(ValueError, match="differ from the plan"):
        plan.run(q[:, :1].repeat(1, 2, 1, 1), k_cache, v_cache, seqlens, table)
    with pytest.raises(ValueError, match="columns"):
        plan.run(q, k_cache, v_cache, seqlens, torch.cat([table, table[:, :1]], dim=1))


# ------------------------------------------------------------------------------------------------
# The tree: auto detection, the caller's tree, bad trees
# ------------------------------------------------------------------------------------------------

def _groups(found):
    return [(tuple(ids.tolist()), n) for ids, n in found]


def test_find_shared_prefixes_hand_built():
    p = 16
    # seqs 0-3 share pages 10, 11; 0-1 then 12, 13; 2-3 then 14; 4 alone; 5-6 share 20 only.
    table = torch.tensor([
        [10, 11, 12, 13, 30, 0],
        [10, 11, 12, 13, 31, 0],
        [10, 11, 14, 32, 0, 0],
        [10, 11, 14, 33, 0, 0],
        [40, 41, 0, 0, 0, 0],
        [20, 50, 0, 0, 0, 0],
        [20, 51, 0, 0, 0, 0],
    ], dtype=torch.int32)
    lens = torch.tensor([5 * p, 4 * p + 1, 3 * p + 9, 4 * p, 2 * p, 2 * p, p + 3],
                        dtype=torch.int32)
    assert _groups(tree.find_shared_prefixes(table, lens, p)) == [
        ((0, 1, 2, 3), 2), ((0, 1), 4), ((2, 3), 3), ((5, 6), 1)]


def test_find_shared_prefixes_full_used_pages_only():
    p = 16
    table = torch.tensor([[1, 2, 3, 0, 0], [1, 2, 3, 0, 0], [1, 2, 3, 0, 0], [7, 0, 0, 0, 0]],
                         dtype=torch.int32)
    # seq 2's page 3 (column 2) is partly filled: not shared by it; the zero padding columns are
    # identical but past every sequence's pages: never shared.
    lens = torch.tensor([3 * p, 3 * p, 2 * p + 5, 10], dtype=torch.int32)
    assert _groups(tree.find_shared_prefixes(table, lens, p)) == [((0, 1, 2), 2), ((0, 1), 3)]
    # Nothing shared: an empty tree, and plain decode even when forced.
    table[1, 0] = 9
    table[2, 0] = 8
    assert tree.find_shared_prefixes(table, lens, p) == []
    q = torch.randn(4, 1, 2, 32, dtype=torch.float16, device=DEVICE)
    cache = torch.randn(10, p, 2, 32, dtype=torch.float16, device=DEVICE)
    plan = kvonce.PagedDecodePlan(q, cache, cache, lens.to(DEVICE), table.to(DEVICE),
                                  shared_prefix="auto", cascade=True)
    assert not plan.uses_cascade


def test_uses_cascade_choice():
    table, lens, _, num_pages = random_tree(31, 4, 16, max_depth=1)
    inputs = make_inputs(table, lens, num_pages, q_len=1, nheads=4, nheads_k=2, head_dim=32,
                         page_size=16, dtype=torch.float16)
    assert not kvonce.PagedDecodePlan(*inputs).uses_cascade
    assert not kvonce.PagedDecodePlan(*inputs, shared_prefix="auto", cascade=False).uses_cascade
    assert kvonce.PagedDecodePlan(*inputs, shared_prefix="auto", cascade=True).uses_cascade
    # A model where nothing pays (a launch costs a second): plain decode.
    slow = prefix.CascadeCostModel(launch_s=1.0)
    base = kvonce.PagedDecodePlan(*inputs)
    assert prefix.plan_cascade(base, *inputs, "auto", cost_model=slow) is None


def test_cost_model_at_the_issue_shapes():
    """The default model keeps a 32k-token prefix shared by 64 sequences (GQA 32/8, d 128) and
    drops a one-page run shared by two."""
    kw = dict(page_size=16, kv_elem=2, suffix_splits=1, num_sms=132,
              config=PrefixDecodeConfig(128, 64, 8, 3), force=False,
              model=prefix.DEFAULT_COST_MODEL)
    big = [tree.PrefixNode(tuple(range(64)), 0, 2048, -1)]
    assert prefix._select_nodes(big, shape=(64, 1, 32, 8, 128), **kw) == big
    tiny = [tree.PrefixNode((0, 1), 0, 1, -1)]
    assert prefix._select_nodes(tiny, shape=(2, 1, 32, 8, 128), **kw) == []


def test_dropped_node_pages_go_to_its_children():
    """A node that does not pay (two sequences, one page: its partials cost more than the page
    it saves) hands its pages to its kept child, whose lo moves down."""
    nodes = [tree.PrefixNode((0, 1), 0, 1, -1), tree.PrefixNode((0, 1), 1, 40, 0),
             tree.PrefixNode((2, 3), 0, 1, -1)]
    model = prefix.CascadeCostModel(launch_s=0.0, reread_bytes_per_s=3.0e12)
    kw = dict(shape=(4, 1, 8, 2, 128), page_size=16, kv_elem=2, suffix_splits=1, num_sms=132,
              config=PrefixDecodeConfig(128, 64, 8, 3))
    kept = prefix._select_nodes(nodes, model=model, force=False, **kw)
    assert [(n.members, n.lo, n.hi, n.parent) for n in kept] == [((0, 1), 0, 40, -1)]
    forced = prefix._select_nodes(nodes, model=model, force=True, **kw)
    assert forced == nodes


BAD_TREES = [
    ("not a list", "auto-ish", ValueError, "shared_prefix must be"),
    ("pair", [(torch.tensor([0, 1], dtype=torch.int32),)], TypeError, "pair"),
    ("float ids", [(torch.tensor([0.0, 1.0]), 1)], TypeError, "int32"),
    ("2-D ids", [(torch.tensor([[0, 1]], dtype=torch.int32), 1)], TypeError, "1-D"),
    ("bool pages", [(torch.tensor([0, 1], dtype=torch.int32), True)], TypeError, "int"),
    ("zero pages", [(torch.tensor([0, 1], dtype=torch.int32), 0)], ValueError, "num_pages"),
    ("too many pages", [(torch.tensor([0, 1], dtype=torch.int32), 99)], ValueError, "num_pages"),
    ("empty", [(torch.tensor([], dtype=torch.int32), 1)], ValueError, "empty"),
    ("out of range", [(torch.tensor([0, 9], dtype=torch.int32), 1)], ValueError, r"\[0, 3\)"),
    ("repeated", [(torch.tensor([1, 1], dtype=torch.int32), 1)], ValueError, "repeated"),
    ("overlap", [(torch.tensor([0, 1], dtype=torch.int32), 1),
                 (torch.tensor([1, 2], dtype=torch.int32), 2)], ValueError, "nested or disjoint"),
    ("subgroup not longer", [(torch.tensor([0, 1, 2], dtype=torch.int32), 2),
                             (torch.tensor([0, 1], dtype=torch.int32), 2)], ValueError,
     "more pages"),
    ("superset longer", [(torch.tensor([0, 1], dtype=torch.int32), 1),
                         (torch.tensor([0, 1, 2], dtype=torch.int32), 2)], ValueError,
     "nested or disjoint"),
]


@pytest.mark.parametrize("name,tree,exc,match", BAD_TREES, ids=[c[0] for c in BAD_TREES])
def test_bad_trees_raise(name, tree, exc, match):
    q = torch.randn(3, 1, 2, 32, dtype=torch.float16, device=DEVICE)
    cache = torch.randn(8, 16, 2, 32, dtype=torch.float16, device=DEVICE)
    table = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 5, 6]], dtype=torch.int32, device=DEVICE)
    lens = torch.full((3,), 40, dtype=torch.int32, device=DEVICE)
    with pytest.raises(exc, match=match):
        kvonce.PagedDecodePlan(q, cache, cache, lens, table, shared_prefix=tree, cascade=True)


def test_validation_mode_checks_the_callers_tree():
    q = torch.randn(3, 1, 2, 32, dtype=torch.float16, device=DEVICE)
    cache = torch.randn(8, 16, 2, 32, dtype=torch.float16, device=DEVICE)
    table = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 5, 6]], dtype=torch.int32, device=DEVICE)
    lens = torch.full((3,), 40, dtype=torch.int32, device=DEVICE)
    wrong = [(torch.tensor([0, 1, 2], dtype=torch.int32), 2)]
    with pytest.raises(ValueError, match="differ in column 1"):
        kvonce.PagedDecodePlan(q, cache, cache, lens, table, shared_prefix=wrong,
                               check_block_table=True)
    with pytest.raises(ValueError, match="cascade must be"):
        kvonce.PagedDecodePlan(q, cache, cache, lens, table, shared_prefix="auto",
                               cascade="yes")


def test_quantized_cache_not_implemented():
    q = torch.randn(2, 1, 2, 32, dtype=torch.float16, device=DEVICE)
    cache = torch.zeros(4, 16, 2, 32, dtype=torch.int8, device=DEVICE)
    scale = torch.ones(4, 16, 2, dtype=torch.float32, device=DEVICE)
    table = torch.tensor([[0, 1], [0, 2]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([20, 20], dtype=torch.int32, device=DEVICE)
    with pytest.raises(NotImplementedError, match="quantized"):
        kvonce.PagedDecodePlan(q, cache, cache, lens, table, k_scale=scale, v_scale=scale,
                               shared_prefix="auto")


# ------------------------------------------------------------------------------------------------
# Custom op and torch.compile
# ------------------------------------------------------------------------------------------------

def _small_cascade_plan():
    table, lens, _, num_pages = random_tree(41, 4, 16, max_depth=1)
    inputs = make_inputs(table, lens, num_pages, q_len=2, nheads=4, nheads_k=2, head_dim=32,
                         page_size=16, dtype=torch.float16)
    with poison_empty:
        plan = kvonce.PagedDecodePlan(*inputs, shared_prefix="auto", cascade=True)
    assert plan.uses_cascade
    return plan, inputs


def test_opcheck():
    plan, inputs = _small_cascade_plan()
    c = plan._cascade
    b, cfg, dec = plan, c.config, plan.config
    args = (*inputs, c.work, c.members, c.prefix_pages, c.o_part, c.lse_part, c.suffix_table,
            c.suffix_seqlens, b.softmax_scale, b.causal, c.suffix_splits, c.layout.block_m,
            cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.kv_cache_modifier, cfg.kv_eviction,
            cfg.int64_kv_offsets, dec.block_n, dec.num_warps, dec.num_stages,
            dec.kv_cache_modifier, dec.kv_eviction, dec.int64_kv_offsets, dec.prefetch_pages,
            dec.swap_ab)
    torch.library.opcheck(torch.ops.kvonce.prefix_decode, args)
    schema = torch.ops.kvonce.prefix_decode.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None
               and a.alias_info.is_write}
    assert mutated == {"o_part", "lse_part", "suffix_table", "suffix_seqlens"}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"] if HAS_CUDA else ["aot_eager"])
def test_compile_fullgraph(backend):
    plan, inputs = _small_cascade_plan()

    def step(q, k_cache, v_cache, seqlens, table):
        return plan.run(q, k_cache, v_cache, seqlens, table, return_lse=True)

    with poison_empty:
        eager = step(*inputs)
    torch._dynamo.reset()
    out, lse = torch.compile(step, fullgraph=True, backend=backend)(*inputs)
    assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1])
    plain = kvonce.paged_attention(*inputs)
    assert rel_err(out, plain) < PLAIN_TOL[torch.float16]


# ------------------------------------------------------------------------------------------------
# GPU: real sizes, bf16, CUDA graphs
# ------------------------------------------------------------------------------------------------

def shared_batch(n, prefix_pages, own_keys, page_size, seed=0):
    """``n`` sequences sharing ``prefix_pages`` pages, each with ``own_keys`` own keys; pages in
    random physical order (the benchmark's layout)."""
    own_pages = -(-own_keys // page_size)
    num_pages = prefix_pages + n * own_pages
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    table = torch.cat([perm[:prefix_pages].expand(n, prefix_pages),
                       perm[prefix_pages:].view(n, own_pages)], dim=1)
    return table.contiguous(), [prefix_pages * page_size + own_keys] * n, num_pages


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nheads,nheads_k,q_len", [(32, 8, 1), (32, 32, 1), (32, 8, 4)])
def test_gpu_real_sizes(dtype, nheads, nheads_k, q_len):
    table, lens, num_pages = shared_batch(16, 256, 200, 16)
    inputs = make_inputs(table, lens, num_pages, q_len=q_len, nheads=nheads, nheads_k=nheads_k,
                         head_dim=128, page_size=16, dtype=dtype)
    check_against_plain(*inputs, shared_prefix="auto")


@gpu_only
def test_cuda_graph_capture_replay_equals_eager():
    table, lens, num_pages = shared_batch(8, 64, 100, 16)
    q, k_cache, v_cache, seqlens, table = make_inputs(table, lens, num_pages, q_len=1, nheads=32,
                                                      nheads_k=8, head_dim=128, page_size=16,
                                                      dtype=torch.bfloat16)
    with poison_empty:
        plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, shared_prefix="auto",
                                      cascade=True)
        eager = plan.run(q, k_cache, v_cache, seqlens, table).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), poison_empty:  # the NaN fill is captured too
        captured = plan.run(q, k_cache, v_cache, seqlens, table)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    q.normal_()
    seqlens.add_(1)  # the own pages have room: lengths are read on the device
    graph.replay()
    torch.cuda.synchronize()
    with poison_empty:
        plain = kvonce.paged_attention(q, k_cache, v_cache, seqlens, table)
    assert rel_err(captured, plain) < PLAIN_TOL[torch.bfloat16]
