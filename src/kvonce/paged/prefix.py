"""Shared-prefix paged decode: the cascade's layout, cost model, plan and custom op.

Sequences share a prefix when their block tables start with the same physical page ids (what
prefix caching, parallel sampling and beam search produce). ``PagedDecodePlan(...,
shared_prefix="auto" | groups)`` builds a ``CascadePlan`` here: a tree of groups of sequences,
each group's shared page run read ONCE for all its members' query rows (the chunk-first kernel,
kernels/prefix_decode.py), each sequence's own pages through the plain decode kernel, and one
LSE merge. Three launches per ``run``; no host sync in ``run`` (the tree is read at plan time),
CUDA-graph capturable, one custom op under torch.compile.

The tree (``find_shared_prefixes``, ``PrefixNode``): paged/prefix_tree.py.

Whether the cascade pays is decided per node and overall by ``CascadeCostModel`` (shapes and the
tree only); ``cascade=True`` forces it wherever the tree has a node, ``False`` never uses it.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .._dispatch import like_inputs, use_op
from ..kernels._launch import next_pow2
from ..kernels.configs import PrefixDecodeConfig, device_info, get_prefix_decode_config
from ..kernels.configs import PagedDecodeConfig
from ..kernels.prefix_decode import WORK_FIELDS, CascadeLaunch
from ._alloc import allocator
from .prefix_tree import PrefixNode, check_group_values, find_shared_prefixes, nodes_from_groups
from .splits import choose_num_splits

__all__ = ["CascadeCostModel", "CascadePlan", "plan_cascade"]


# ------------------------------------------------------------------------------------------------
# Layout and the cascade decision
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where each node's work goes: row blocks, key chunks, slots."""
    block_m: int
    mblocks: tuple[int, ...]     # per node
    chunk_keys: tuple[int, ...]  # per node: keys per chunk
    splits: tuple[int, ...]      # per node: key chunks
    slot_base: tuple[int, ...]   # per node: first node slot (after the suffix slots)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _layout(nodes, *, rows_per_member: int, nheads_k: int, page_size: int, num_sms: int,
            config: PrefixDecodeConfig) -> _Layout:
    """Row blocks of ``min(config.block_m, next_pow2(largest node's rows))`` (>= 16); each node's
    run cut into key chunks until the node programs reach ``config.programs_per_sm`` per SM (no
    chunk under ``config.min_keys_per_split`` keys, at most ``config.max_splits_per_node``)."""
    rows = [len(n.members) * rows_per_member for n in nodes]
    block_m = min(config.block_m, max(16, next_pow2(max(rows))))
    mblocks = [_cdiv(r, block_m) for r in rows]
    keys = [(n.hi - n.lo) * page_size for n in nodes]
    align = max(config.block_n, page_size)
    base = nheads_k * sum(mblocks)
    target = int(config.programs_per_sm * num_sms)
    chunk = max(keys)
    if base < target:
        total = nheads_k * sum(m * k for m, k in zip(mblocks, keys))
        chunk = max(config.min_keys_per_split, _cdiv(total, target))
    chunk_keys, splits = [], []
    for k in keys:
        s = min(config.max_splits_per_node, max(1, _cdiv(k, chunk)))
        c = _cdiv(_cdiv(k, s), align) * align  # whole tiles and pages
        chunk_keys.append(c)
        splits.append(_cdiv(k, c))
    slot_base = []
    for n in nodes:
        slot_base.append(0 if n.parent < 0 else slot_base[n.parent] + splits[n.parent])
    return _Layout(block_m, tuple(mblocks), tuple(chunk_keys), tuple(splits), tuple(slot_base))


@dataclasses.dataclass(frozen=True)
class CascadeCostModel:
    """Time estimates (seconds) deciding cascade or plain decode per node and overall.

    NOT CALIBRATED on kvonce's kernels: to be replaced by fits to ``python -m kvonce bench
    prefix``. ``reread_bytes_per_s`` is fitted to the one plain-decode measurement in issue 12
    (928 us at N 64, prefix 32768, own 256, GQA 32/8, d 128 on the H100: the shared pages' 63
    re-reads, 8.5 GB, came at ~9.8e12 B/s, from L2: the sequences walk the run in near lockstep,
    so even a run larger than the L2 is mostly re-read from it); the others are data-sheet-level
    guesses. Per node with ``m`` members, ``B`` bytes of shared K/V, ``F`` tensor-core FLOPs
    (padded row blocks x keys x d x 4 x KV heads) and ``P`` bytes of float32 partials (written
    and read back by the merge):

        plain   = B / hbm + (m - 1) * B / reread
        cascade = max(B / hbm, F / mma) + P / hbm

    A node is kept when ``cascade * margin < plain``; a dropped node's pages go to its kept
    descendants (or to the suffixes). The cascade is used when the kept nodes' saving exceeds
    ``margin`` times the fixed cost: ``extra_launches * launch_s`` plus the suffix partials'
    round trip.
    """
    hbm_bytes_per_s: float = 3.0e12
    reread_bytes_per_s: float = 9.0e12
    mma_flops_per_s: float = 350e12
    launch_s: float = 3e-6
    extra_launches: int = 2
    margin: float = 1.1


DEFAULT_COST_MODEL = CascadeCostModel()


def _node_gain(node, lo, *, m_rows, mblocks, block_m, splits, kv_bytes_per_key, head_dim,
               nheads_k, page_size, model) -> tuple[float, float]:
    """(plain, cascade) seconds for the node's pages ``[lo, node.hi)``."""
    keys = (node.hi - lo) * page_size
    nbytes = keys * kv_bytes_per_key
    plain = (nbytes / model.hbm_bytes_per_s
             + (len(node.members) - 1) * nbytes / model.reread_bytes_per_s)
    flops = 4.0 * mblocks * block_m * keys * head_dim * nheads_k
    partial = m_rows * nheads_k * splits * (head_dim + 1) * 4 * 2
    cascade = (max(nbytes / model.hbm_bytes_per_s, flops / model.mma_flops_per_s)
               + partial / model.hbm_bytes_per_s)
    return plain, cascade


def _select_nodes(nodes, *, shape, page_size, kv_elem, suffix_splits, num_sms, config, model,
                  force: bool) -> list[PrefixNode]:
    """The nodes the cascade runs (all of them when forced), re-linked: a dropped node's pages
    go to its kept children (their ``lo`` moves down to its own)."""
    batch, q_len, nheads, nheads_k, head_dim = shape
    rpm = nheads // nheads_k * q_len
    kv_bytes_per_key = 2 * nheads_k * head_dim * kv_elem
    lay = _layout(nodes, rows_per_member=rpm, nheads_k=nheads_k, page_size=page_size,
                  num_sms=num_sms, config=config)
    kept_index = [-1] * len(nodes)
    eff_lo = [0] * len(nodes)
    kept: list[PrefixNode] = []
    for i, n in enumerate(nodes):
        p = n.parent
        eff_lo[i] = 0 if p < 0 else (n.lo if kept_index[p] >= 0 else eff_lo[p])
        if not force:
            plain, cascade = _node_gain(n, eff_lo[i], m_rows=len(n.members) * rpm,
                                        mblocks=lay.mblocks[i], block_m=lay.block_m,
                                        splits=lay.splits[i], kv_bytes_per_key=kv_bytes_per_key,
                                        head_dim=head_dim, nheads_k=nheads_k,
                                        page_size=page_size, model=model)
            if cascade * model.margin >= plain:
                continue
        anc = p
        while anc >= 0 and kept_index[anc] < 0:
            anc = nodes[anc].parent
        kept_index[i] = len(kept)
        kept.append(PrefixNode(n.members, eff_lo[i], n.hi, -1 if anc < 0 else kept_index[anc]))
    if force or not kept:
        return kept
    # Overall: the kept nodes' saving (re-laid out) against the fixed cost.
    lay = _layout(kept, rows_per_member=rpm, nheads_k=nheads_k, page_size=page_size,
                  num_sms=num_sms, config=config)
    saving = 0.0
    for i, n in enumerate(kept):
        plain, cascade = _node_gain(n, n.lo, m_rows=len(n.members) * rpm, mblocks=lay.mblocks[i],
                                    block_m=lay.block_m, splits=lay.splits[i],
                                    kv_bytes_per_key=kv_bytes_per_key, head_dim=head_dim,
                                    nheads_k=nheads_k, page_size=page_size, model=model)
        saving += plain - cascade
    suffix_partials = batch * q_len * nheads * suffix_splits * (head_dim + 1) * 4 * 2
    fixed = model.extra_launches * model.launch_s + suffix_partials / model.hbm_bytes_per_s
    return kept if saving > model.margin * fixed else []


# ------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------

class CascadePlan:
    """The cascade of one decode step: tree, launch shapes, device metadata and scratch.

    Made by ``PagedDecodePlan(..., shared_prefix=...)`` (through ``plan_cascade``) when the cascade
    pays; its ``run`` is what ``PagedDecodePlan.run`` then calls. Device tensors built here:
    ``work`` int32 ``[num_work, 6]`` (member_start, member_count, row0, key_lo, key_hi, slot per
    work item), ``members`` int32 (node members, node after node), ``prefix_pages`` int32
    ``[batch]`` (pages of each sequence's deepest node); scratch ``o_part``/``lse_part`` (slot
    layout: kernels/prefix_decode.py; unused slots' LSE set to -inf here, never written again),
    ``suffix_table [batch, suffix_width]`` and ``suffix_seqlens [batch]`` (written by the
    chunk-first launch every run). The scratch is reused by every ``run``: one plan, one stream.
    """

    def __init__(self, base, q, k_cache, block_table, nodes: list[PrefixNode], *,
                 num_splits: int, config: PrefixDecodeConfig, num_sms: int):
        batch, q_len, nheads, head_dim = q.shape
        page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
        device = q.device
        self._base, self.nodes, self.config = base, nodes, config
        prefix_pages = _prefix_pages(nodes, batch)
        self.suffix_width = _suffix_width(prefix_pages, block_table.shape[1])
        suffix_splits = self.suffix_splits = num_splits or choose_num_splits(
            batch, nheads_k, self.suffix_width * page_size, num_sms, base.config)
        lay = _layout(nodes, rows_per_member=nheads // nheads_k * q_len, nheads_k=nheads_k,
                      page_size=page_size, num_sms=num_sms, config=config)
        self.layout = lay
        work, members = [], []
        chain = np.zeros(batch, dtype=np.int64)  # node slots each sequence uses
        for i, n in enumerate(nodes):
            start = len(members)
            members.extend(n.members)
            for s in range(lay.splits[i]):
                key_lo = n.lo * page_size + s * lay.chunk_keys[i]
                key_hi = min(key_lo + lay.chunk_keys[i], n.hi * page_size)
                for mb in range(lay.mblocks[i]):
                    work.append((start, len(n.members), mb * lay.block_m, key_lo, key_hi,
                                 suffix_splits + lay.slot_base[i] + s))
            # Parents come first, so the deepest node's count stays.
            chain[np.asarray(n.members)] = lay.slot_base[i] + lay.splits[i]
        self.num_slots = suffix_splits + int(chain.max(initial=0))
        as_i32 = lambda a: torch.from_numpy(np.asarray(a, dtype=np.int32)).to(device)
        self.work = as_i32(work).reshape(len(work), WORK_FIELDS)
        self.members = as_i32(members)
        self.prefix_pages = as_i32(prefix_pages)
        s = self.num_slots
        self.o_part = allocator.empty((batch, q_len, nheads, s, head_dim), dtype=torch.float32,
                                      device=device)
        self.lse_part = allocator.empty((batch, q_len, nheads, s), dtype=torch.float32,
                                        device=device)
        unused = torch.from_numpy(np.arange(s)[None, :] >= suffix_splits + chain[:, None])
        self.lse_part.masked_fill_(unused.to(device)[:, None, None, :], float("-inf"))
        self.suffix_table = torch.zeros((batch, self.suffix_width), dtype=torch.int32,
                                        device=device)
        self.suffix_seqlens = torch.zeros((batch,), dtype=torch.int32, device=device)
        self._bt_width = block_table.shape[1]
        self._launches: dict = {}

    def _check(self, q, k_cache, v_cache, cache_seqlens, block_table) -> None:
        self._base._check_like_plan(q, k_cache, v_cache, cache_seqlens, block_table)
        if block_table.shape[1] != self._bt_width:
            raise ValueError(f"PagedDecodePlan.run: block_table has {block_table.shape[1]} "
                             f"columns, the shared-prefix plan was made for {self._bt_width}: "
                             f"make a new plan")

    def _bind(self, q, k_cache, v_cache, block_table, return_lse: bool) -> CascadeLaunch:
        base = self._base
        return CascadeLaunch(q, k_cache, v_cache, block_table, num_work=self.work.shape[0],
                             slots=self.num_slots, suffix_splits=self.suffix_splits,
                             suffix_width=self.suffix_width, block_m=self.layout.block_m,
                             softmax_scale=base.softmax_scale, causal=base.causal,
                             config=self.config, decode_config=base.config,
                             store_lse=return_lse)

    def run(self, q, k_cache, v_cache, cache_seqlens, block_table, *, return_lse: bool = False):
        """``PagedDecodePlan.run`` on the cascade path: same arguments, same results (through
        the custom op where ``kvonce._dispatch.use_op`` says)."""
        if use_op(q, k_cache, v_cache, cache_seqlens, block_table):
            self._check(q, k_cache, v_cache, cache_seqlens, block_table)
            out, lse = self._run_op(q, k_cache, v_cache, cache_seqlens, block_table)
            return (out, lse) if return_lse else out
        layout = (q.stride(), k_cache.stride(), v_cache.stride(), block_table.stride(), return_lse)
        launch = self._launches.get(layout)
        if (launch is None or q.shape != self._base._q_shape or block_table.shape[1]
                != self._bt_width or k_cache.shape[1:] != self._base._kv_tail
                or v_cache.shape != k_cache.shape or q.dtype is not self._base._dtype
                or k_cache.dtype is not self._base._kv_dtype or v_cache.dtype is not k_cache.dtype
                or block_table.shape[0] != self._base._batch
                or cache_seqlens.shape[0] != self._base._batch or q.device != self._base._device):
            self._check(q, k_cache, v_cache, cache_seqlens, block_table)
            launch = self._launches[layout] = self._bind(q, k_cache, v_cache, block_table,
                                                         return_lse)
        out, lse = _outputs(q, return_lse)
        launch(q, k_cache, v_cache, cache_seqlens, block_table, self.work, self.members,
               self.prefix_pages, self.o_part, self.lse_part, self.suffix_table,
               self.suffix_seqlens, out, lse)
        return (out, lse) if return_lse else out

    def _run_op(self, q, k_cache, v_cache, cache_seqlens, block_table):
        b, c = self._base, self.config
        d = b.config
        # The plan's metadata and scratch in the inputs' fake mode, if they are fake.
        plan_tensors = like_inputs(q, self.work, self.members, self.prefix_pages, self.o_part,
                                   self.lse_part, self.suffix_table, self.suffix_seqlens)
        return torch.ops.kvonce.prefix_decode(
            q, k_cache, v_cache, cache_seqlens, block_table, *plan_tensors, b.softmax_scale,
            b.causal, self.suffix_splits, self.layout.block_m, c.block_n, c.num_warps,
            c.num_stages, c.kv_cache_modifier, c.kv_eviction, c.int64_kv_offsets, d.block_n,
            d.num_warps, d.num_stages, d.kv_cache_modifier, d.kv_eviction, d.int64_kv_offsets,
            d.prefetch_pages, d.swap_ab)


def _prefix_pages(nodes: list[PrefixNode], batch: int) -> np.ndarray:
    """Pages of each sequence's deepest node (0: in no node)."""
    pages = np.zeros(batch, dtype=np.int64)
    for n in nodes:  # parents first: the deepest node's count stays
        pages[np.asarray(n.members)] = n.hi
    return pages


def _suffix_width(prefix_pages: np.ndarray, max_pages: int) -> int:
    """Columns of the suffix view: the longest suffix a table row can hold (at least 1)."""
    return max(1, max_pages - int(prefix_pages.min(initial=0)))


def _outputs(q, return_lse: bool):
    batch, q_len, nheads, _ = q.shape
    out = allocator.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = None
    if return_lse:
        lse = allocator.empty((batch, nheads, q_len), dtype=torch.float32, device=q.device)
    return out, lse


def plan_cascade(base, q, k_cache, v_cache, cache_seqlens, block_table, shared_prefix, *,
                 cascade="auto", num_splits: int = 0, check: bool = False,
                 cost_model: CascadeCostModel | None = None,
                 config: PrefixDecodeConfig | None = None) -> CascadePlan | None:
    """The cascade plan for ``PagedDecodePlan`` ``base`` (already validated), or None for plain
    decode.

    ``shared_prefix``: "auto" (``find_shared_prefixes``: reads the block table and the lengths on
    the host) or the caller's ``[(seq_ids, num_pages), ...]`` (checked against the block table
    with ``check``, validation mode). ``cascade``: "auto" (``cost_model`` decides, per node and
    overall), True (every node of the tree; plain only when the tree is empty) or False.
    ``num_splits`` > 0 forces the suffix decode's split count. ``config``: the chunk-first
    launch config, overriding the table (experiments, sweeps).
    """
    if cascade not in ("auto", True, False):
        raise ValueError(f"cascade must be 'auto', True or False, got {cascade!r}")
    batch, q_len, nheads, head_dim = q.shape
    page_size, nheads_k = k_cache.shape[1], k_cache.shape[2]
    if isinstance(shared_prefix, str):
        if shared_prefix != "auto":
            raise ValueError(f"shared_prefix must be None, 'auto' or a list of "
                             f"(seq_ids, num_pages), got {shared_prefix!r}")
        groups = find_shared_prefixes(block_table, cache_seqlens, page_size)
        nodes = nodes_from_groups(groups, batch, block_table.shape[1])
    else:
        nodes = nodes_from_groups(shared_prefix, batch, block_table.shape[1])
        if check:
            check_group_values(nodes, block_table)
    if cascade is False or not nodes:
        return None
    capability, num_sms = device_info(q.device)
    config = config or get_prefix_decode_config(capability, head_dim, q.element_size())
    # The suffix split count of the whole tree (the one kept may differ): the fixed cost only.
    suffix_width = _suffix_width(_prefix_pages(nodes, batch), block_table.shape[1])
    suffix_splits = num_splits or choose_num_splits(batch, nheads_k, suffix_width * page_size,
                                                    num_sms, base.config)
    nodes = _select_nodes(nodes, shape=(batch, q_len, nheads, nheads_k, head_dim),
                          page_size=page_size, kv_elem=k_cache.element_size(),
                          suffix_splits=suffix_splits, num_sms=num_sms, config=config,
                          model=cost_model or DEFAULT_COST_MODEL, force=cascade is True)
    if not nodes:
        return None
    return CascadePlan(base, q, k_cache, block_table, nodes, num_splits=num_splits,
                       config=config, num_sms=num_sms)


# ------------------------------------------------------------------------------------------------
# torch.library custom op (what torch.compile and dispatch modes see; the plain eager path
# launches directly)
# ------------------------------------------------------------------------------------------------

@torch.library.custom_op("kvonce::prefix_decode",
                         mutates_args=("o_part", "lse_part", "suffix_table", "suffix_seqlens"))
def _prefix_decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      cache_seqlens: torch.Tensor, block_table: torch.Tensor, work: torch.Tensor,
                      members: torch.Tensor, prefix_pages: torch.Tensor, o_part: torch.Tensor,
                      lse_part: torch.Tensor, suffix_table: torch.Tensor,
                      suffix_seqlens: torch.Tensor, softmax_scale: float, causal: bool,
                      suffix_splits: int, block_m: int, block_n: int, num_warps: int,
                      num_stages: int, kv_cache_modifier: str, kv_eviction: str,
                      int64_kv_offsets: bool, dec_block_n: int, dec_num_warps: int,
                      dec_num_stages: int, dec_kv_cache_modifier: str, dec_kv_eviction: str,
                      dec_int64_kv_offsets: bool, dec_prefetch_pages: bool, dec_swap_ab: bool
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The cascade (``CascadePlan.run``): ``(out [batch, q_len, nheads, d], lse float32 [batch,
    nheads, q_len])``. ``work``, ``members``, ``prefix_pages`` are the plan's metadata;
    ``o_part``, ``lse_part``, ``suffix_table``, ``suffix_seqlens`` its scratch (written, so
    declared mutated; the LSE of unused slots stays -inf); then the chunk-first config's fields
    and the suffix decode config's (``dec_*``), one by one."""
    config = PrefixDecodeConfig(block_m, block_n, num_warps, num_stages,
                                kv_cache_modifier=kv_cache_modifier, kv_eviction=kv_eviction,
                                int64_kv_offsets=int64_kv_offsets)
    dec = PagedDecodeConfig(dec_block_n, dec_num_warps, dec_num_stages,
                            kv_cache_modifier=dec_kv_cache_modifier, kv_eviction=dec_kv_eviction,
                            int64_kv_offsets=dec_int64_kv_offsets,
                            prefetch_pages=dec_prefetch_pages, swap_ab=dec_swap_ab)
    out, lse = _outputs(q, True)
    CascadeLaunch(q, k_cache, v_cache, block_table, num_work=work.shape[0],
                  slots=o_part.shape[3], suffix_splits=suffix_splits,
                  suffix_width=suffix_table.shape[1], block_m=block_m,
                  softmax_scale=softmax_scale, causal=causal, config=config, decode_config=dec,
                  store_lse=True)(q, k_cache, v_cache, cache_seqlens, block_table, work, members,
                                  prefix_pages, o_part, lse_part, suffix_table, suffix_seqlens,
                                  out, lse)
    return out, lse


@_prefix_decode_op.register_fake
def _(q, *args):
    batch, q_len, nheads, _ = q.shape
    return (torch.empty_like(q),
            q.new_empty((batch, nheads, q_len), dtype=torch.float32))

