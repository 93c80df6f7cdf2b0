"""The shared-prefix tree: groups of sequences whose block tables start with the same pages.

Sequences share a prefix when their block tables start with the same physical page ids (what
prefix caching, parallel sampling and beam search produce). ``find_shared_prefixes`` reads the
groups from a block table; ``nodes_from_groups`` checks a tree (found or the caller's) and turns
it into ``PrefixNode``s, which the cascade plan (paged/prefix.py) lays out and runs.

The tree. ``groups = [(seq_ids, num_pages), ...]``: the sequences ``seq_ids`` (int32 tensor) have
identical block-table entries in columns ``[0, num_pages)``. Groups are nested or disjoint, and a
group inside another shares more pages::

    seq 0: [p0 p1 p2 p3 | a0 a1]        groups: ([0, 1, 2, 3], 2)   node 0: pages [0, 2)
    seq 1: [p0 p1 p2 p3 | b0]                   ([0, 1], 4)         node 1: pages [2, 4)
    seq 2: [p0 p1 | c0 c1 c2]
    seq 3: [p0 p1 | d0]

Each group becomes a node computing its pages beyond its parent's (``lo, hi``); each sequence's
suffix starts after its deepest node (seq 0: page 4, seq 2: page 2).
"""
from __future__ import annotations

import dataclasses
import operator

import numpy as np
import torch

from .._dispatch import require_values

__all__ = ["find_shared_prefixes", "PrefixNode", "nodes_from_groups", "check_group_values"]


@dataclasses.dataclass(frozen=True)
class PrefixNode:
    """One group of the tree: ``members`` (sorted sequence indices) share block-table columns
    ``[0, hi)``; this node computes columns ``[lo, hi)`` (``lo`` = its parent's ``hi``, 0 at a
    root); ``parent`` is the parent's index in the node list (-1 at a root)."""
    members: tuple[int, ...]
    lo: int
    hi: int
    parent: int


# ------------------------------------------------------------------------------------------------
# The tree: found on the host, or the caller's, checked
# ------------------------------------------------------------------------------------------------

def find_shared_prefixes(block_table: torch.Tensor, cache_seqlens: torch.Tensor,
                         page_size: int) -> list[tuple[torch.Tensor, int]]:
    """Groups of sequences whose block tables start with the same page ids, as a tree.

    Reads ``block_table`` (int32 ``[batch, max_pages]``) and ``cache_seqlens`` (int32 ``[batch]``)
    on the host once (a sync when they live on the GPU). Only full pages count: column ``c`` can
    be shared by sequence ``b`` only if ``c < cache_seqlens[b] // page_size`` (entries past a
    sequence's pages are padding, and a partly filled page is its own). A group has at least two
    sequences; a subgroup shares a strictly longer run.

    Returns
    -------
    ``[(seq_ids, num_pages), ...]``: ``seq_ids`` sorted int32 CPU tensors; a group comes before
    the groups inside it. The format ``PagedDecodePlan(shared_prefix=...)`` takes.

    Raises ``ValueError`` for fake or meta tensors (no values to read: make the plan eagerly).
    """
    require_values("find_shared_prefixes (shared_prefix='auto')", block_table=block_table,
                   cache_seqlens=cache_seqlens)
    table = block_table.detach().cpu().numpy()  # sync-ok: plan time, once per step (issue 12)
    lens = cache_seqlens.detach().cpu().numpy().astype(np.int64)  # sync-ok: plan time
    batch, max_pages = table.shape
    full = np.minimum(np.maximum(lens, 0) // int(page_size), max_pages)
    found = []
    stack = [(np.arange(batch), 0)]  # (sequences sharing columns [0, col), col)
    while stack:
        members, col = stack.pop()
        alive = members[full[members] > col]
        if alive.size < 2:
            continue
        ids = table[alive, col]
        order = np.argsort(ids, kind="stable")
        alive, ids = alive[order], ids[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        for s, e in zip(starts, np.r_[starts[1:], ids.size]):
            if e - s < 2:
                continue
            group = np.sort(alive[s:e])
            block = table[group, col:int(full[group].min())]
            agree = (block == block[:1]).all(axis=0)
            end = col + (int(np.argmin(agree)) if not agree.all() else agree.size)
            found.append((group, end))
            stack.append((group, end))
    found.sort(key=lambda f: (int(f[0][0]), f[1]))  # a group before the groups inside it
    return [(torch.from_numpy(g.astype(np.int32)), int(end)) for g, end in found]


def nodes_from_groups(groups, batch: int, max_pages: int) -> list[PrefixNode]:
    """Check the structure of ``[(seq_ids, num_pages), ...]`` (reads ``seq_ids`` on the host)
    and return its nodes, parents first."""
    if not isinstance(groups, (list, tuple)):
        raise TypeError(f"shared_prefix must be None, 'auto' or a list of (seq_ids, num_pages), "
                        f"got {type(groups).__name__}")
    entries = []
    for i, entry in enumerate(groups):
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
            raise TypeError(f"shared_prefix[{i}] must be a (seq_ids, num_pages) pair, got "
                            f"{type(entry).__name__}")
        ids, num_pages = entry
        if (not isinstance(ids, torch.Tensor) or ids.dim() != 1
                or ids.dtype not in (torch.int32, torch.int64)):
            raise TypeError(f"shared_prefix[{i}]: seq_ids must be a 1-D int32 tensor, got "
                            f"{getattr(ids, 'dtype', type(ids).__name__)} "
                            f"{tuple(getattr(ids, 'shape', ()))}")
        if isinstance(num_pages, bool):
            raise TypeError(f"shared_prefix[{i}]: num_pages must be an int, got bool")
        try:
            num_pages = operator.index(num_pages)
        except TypeError:
            raise TypeError(f"shared_prefix[{i}]: num_pages must be an int, got "
                            f"{type(num_pages).__name__}") from None
        if not 1 <= num_pages <= max_pages:
            raise ValueError(f"shared_prefix[{i}]: num_pages must be in [1, {max_pages}] "
                             f"(block_table's columns), got {num_pages}")
        require_values(f"shared_prefix[{i}]", seq_ids=ids)
        members = sorted(int(b) for b in ids.tolist())  # sync-ok: plan time (caller's tree)
        if not members:
            raise ValueError(f"shared_prefix[{i}]: seq_ids is empty")
        if members[0] < 0 or members[-1] >= batch:
            raise ValueError(f"shared_prefix[{i}]: seq_ids must be in [0, {batch}), got "
                             f"{members[0] if members[0] < 0 else members[-1]}")
        if len(set(members)) != len(members):
            raise ValueError(f"shared_prefix[{i}]: seq_ids has repeated sequences")
        entries.append((members, num_pages, i))
    entries.sort(key=lambda e: (e[1], -len(e[0])))
    owner = [-1] * batch  # deepest node so far holding each sequence
    nodes: list[PrefixNode] = []
    for members, num_pages, i in entries:
        parents = {owner[b] for b in members}
        p = parents.pop() if len(parents) == 1 else None
        if p is None or (p >= 0 and nodes[p].hi >= num_pages):
            raise ValueError(f"shared_prefix[{i}] does not fit the tree: groups must be nested or "
                             f"disjoint, and a group inside another must share more pages")
        nodes.append(PrefixNode(tuple(members), nodes[p].hi if p >= 0 else 0, num_pages, p))
        for b in members:
            owner[b] = len(nodes) - 1
    return nodes


def check_group_values(nodes: list[PrefixNode], block_table: torch.Tensor) -> None:
    """Validation mode (host sync): every group's rows agree on its columns."""
    require_values("check_block_table=True", block_table=block_table)
    for node in nodes:
        idx = torch.tensor(node.members, dtype=torch.long, device=block_table.device)
        rows = block_table[idx, :node.hi]
        differ = (rows != rows[:1]).any(dim=1)
        if bool(differ.any()):
            b = node.members[int(torch.nonzero(differ)[0, 0])]
            c = int(torch.nonzero(rows[int(torch.nonzero(differ)[0, 0])] != rows[0])[0, 0])
            raise ValueError(f"shared_prefix: sequences {node.members[0]} and {b} are grouped for "
                             f"{node.hi} pages but their block tables differ in column {c}")

