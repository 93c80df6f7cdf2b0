"""Zigzag layout helpers of the original llama3 context-parallel path (kvonce's own code).

Context parallel over ``world_size`` ranks: each global sequence ``b`` of length ``L_b`` (a multiple
of ``2 * world_size``) is cut into ``2 * world_size`` chunks of ``c_b = L_b / (2 * world_size)``
tokens; rank ``r`` holds chunks ``r`` and ``2 * world_size - 1 - r`` of every sequence, in that
order, sequence after sequence. Its local ``cu_seqlens`` are the global ones divided by
``world_size``. An all-gather of local K/V gives ``kv_buffer [2, world_size * total_local,
nheads_k, headdim]`` ordered by rank, then local position::

    world 2, one sequence of 8 chunks of c tokens:
    rank 0 holds [c0 c3], rank 1 holds [c1 c2]  ->  kv_buffer rows: c0 c3 | c1 c2

These functions are the baseline (and the reference) that kvonce's fused path replaces. They keep
the original's interface, including its host-side metadata (Python lists of ranges), and so its
host syncs; kvonce's own fast path is ``zigzag.fused``.
"""
from __future__ import annotations

import torch

__all__ = [
    "zigzag_shard",
    "zigzag_unshard",
    "split_q_by_zigzag_chunk_index",
    "rearrange_kv_from_zigzag_to_contiguous",
    "zigzag_to_contiguous_index",
    "compute_kv_slices_for_groups",
]


def _check_two_groups(n_chunks: int) -> None:
    if n_chunks != 2:
        raise NotImplementedError(f"n_chunks must be 2 (one group per local chunk), got {n_chunks}")


def split_q_by_zigzag_chunk_index(
    q: torch.Tensor, cu_seqlens_q: torch.Tensor, world_size: int, rank: int, n_chunks: int = 2,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Split a rank's local zigzag q into its early-chunk group and its late-chunk group.

    Parameters
    ----------
    q : ``[total_local, nheads, headdim]``; sequence ``b`` holds chunk ``rank`` then chunk
        ``2 * world_size - 1 - rank``, ``c_b`` tokens each.
    cu_seqlens_q : int32 ``[batch + 1]``, LOCAL.

    Returns
    -------
    chunk_q_list : ``[q0, q1]``, ``q_g [sum_b c_b, nheads, headdim]`` (copies)
    chunk_cu_seqlens_q_list : int32 ``[batch + 1]`` each (cumulative ``c_b``)
    chunk_indices_list : int64 local row of each group row (for the scatter back)
    """
    _check_two_groups(n_chunks)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    half = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]) // 2  # c_b, on device
    cu_half = torch.zeros_like(cu_seqlens_q)
    cu_half[1:] = torch.cumsum(half, 0)
    total_half = q.shape[0] // 2
    # Row i of group 0 belongs to sequence b = searchsorted(cu_half, i); its local row is
    # cu_q[b] + (i - cu_half[b]); group 1 is c_b rows further.
    rows = torch.arange(total_half, device=q.device, dtype=torch.int64)
    seq = torch.searchsorted(cu_half.to(torch.int64), rows, right=True) - 1
    idx0 = cu_seqlens_q.to(torch.int64)[seq] + rows - cu_half.to(torch.int64)[seq]
    idx1 = idx0 + half.to(torch.int64)[seq]
    cu_list = [cu_half, cu_half.clone()]
    return [q.index_select(0, idx0), q.index_select(0, idx1)], cu_list, [idx0, idx1]


def zigzag_to_contiguous_index(cu_seqlens: torch.Tensor, world_size: int, total_local: int) -> torch.Tensor:
    """For each row of the contiguous (global order) K/V, the row of the gathered zigzag buffer
    that holds it. int64 ``[world_size * total_local]``, computed on the device."""
    cu = cu_seqlens.to(torch.int64)
    chunk = (cu[1:] - cu[:-1]) // 2
    cu_global = cu * world_size
    pos = torch.arange(world_size * total_local, device=cu.device, dtype=torch.int64)
    seq = torch.searchsorted(cu_global, pos, right=True) - 1
    seq = seq.clamp(max=cu.shape[0] - 2)
    j_in_seq = pos - cu_global[seq]
    c = chunk[seq].clamp(min=1)
    j = j_in_seq // c
    early = j < world_size
    owner = torch.where(early, j, 2 * world_size - 1 - j)
    local = j_in_seq - j * c + torch.where(early, 0, c)
    return owner * total_local + cu[seq] + local


def rearrange_kv_from_zigzag_to_contiguous(
    kv_buffer: torch.Tensor, world_size: int, cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    """Copy the gathered zigzag K/V into contiguous global order.

    Parameters
    ----------
    kv_buffer : ``[2, world_size * total_local, nheads_k, headdim]`` (K then V), ordered by rank.
    cu_seqlens : int32 ``[batch + 1]``, LOCAL (global / world_size).

    Returns
    -------
    ``[2, world_size * total_local, nheads_k, headdim]``: sequence ``b`` at rows
    ``world_size * cu_seqlens[b] ..``, chunks in order 0 .. 2 * world_size - 1. A new tensor
    (one gather), as in the original path.
    """
    total_local = kv_buffer.shape[1] // world_size
    index = zigzag_to_contiguous_index(cu_seqlens, world_size, total_local)
    return kv_buffer.index_select(1, index)


def compute_kv_slices_for_groups(
    cu_seqlens_k: torch.Tensor, chunk_idx_0: int, chunk_idx_1: int, world_size: int,
    chunk_cu_seqlens_q_list: list[torch.Tensor], n_chunks: int = 2,
) -> list[tuple[list[tuple[int, int]], torch.Tensor]]:
    """Key ranges each group needs in the contiguous K/V: group ``g`` (chunk index ``i_g``) of
    sequence ``b`` sees ``[W_b, W_b + (i_g + 1) c_b)`` where ``W_b = world_size * cu_seqlens_k[b]``.

    Returns ``[(ranges_0, cu_seqlens_k_0), (ranges_1, cu_seqlens_k_1)]`` with ``ranges_g`` a list of
    ``(start, end)`` Python ints and ``cu_seqlens_k_g`` int32 ``[batch + 1]`` of the sliced K/V.
    Reads ``cu_seqlens_k`` on the host, as the original does (baseline only).
    """
    _check_two_groups(n_chunks)
    cu_local = [int(x) for x in cu_seqlens_k.tolist()]  # sync-ok: baseline metadata, as the original
    batch = len(cu_local) - 1
    for g, cu_q in enumerate(chunk_cu_seqlens_q_list):
        if cu_q.shape[0] != batch + 1:
            raise ValueError(f"chunk_cu_seqlens_q_list[{g}] has {cu_q.shape[0] - 1} sequences, "
                             f"cu_seqlens_k has {batch}")
    slices = []
    for chunk_idx in (chunk_idx_0, chunk_idx_1):
        ranges, cu = [], [0]
        for b in range(batch):
            start = world_size * cu_local[b]
            chunk = (cu_local[b + 1] - cu_local[b]) // 2
            needed = (chunk_idx + 1) * chunk
            ranges.append((start, start + needed))
            cu.append(cu[-1] + needed)
        slices.append((ranges, torch.tensor(cu, dtype=torch.int32, device=cu_seqlens_k.device)))
    return slices



def _local_to_global_index(cu_seqlens: torch.Tensor, world_size: int, rank: int,
                           total_local: int) -> torch.Tensor:
    """int64 ``[total_local]``: the global row of each of ``rank``'s local rows (device math)."""
    cu = cu_seqlens.to(torch.int64)
    cu_local = torch.div(cu, world_size, rounding_mode="floor")
    rows = torch.arange(total_local, device=cu.device, dtype=torch.int64)
    seq = (torch.searchsorted(cu_local, rows, right=True) - 1).clamp(0, cu.shape[0] - 2)
    j = rows - cu_local[seq]                                    # position in the local sequence
    c = torch.div(cu[seq + 1] - cu[seq], 2 * world_size, rounding_mode="floor")  # chunk length
    late = j >= c
    chunk = torch.where(late, 2 * world_size - 1 - rank, rank)
    return cu[seq] + chunk * c + j - torch.where(late, c, 0)


def zigzag_shard(x: torch.Tensor, cu_seqlens: torch.Tensor, world_size: int, rank: int,
                 dim: int = 0) -> torch.Tensor:
    """This rank's zigzag tokens of ``x`` (input ids, position ids, labels, hidden states...).

    Parameters
    ----------
    x : any tensor whose ``dim`` runs over the packed GLOBAL tokens (``cu_seqlens[-1]`` of them).
    cu_seqlens : int32 ``[batch + 1]``, GLOBAL; every length a multiple of ``2 * world_size``.

    Returns
    -------
    ``x`` with ``dim`` cut to ``total // world_size`` rows: sequence after sequence, chunk ``rank``
    then chunk ``2 * world_size - 1 - rank`` (a gather on the device; no host sync).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if x.shape[dim] % world_size != 0:
        raise ValueError(f"x has {x.shape[dim]} tokens along dim {dim}, not a multiple of "
                         f"world_size={world_size}")
    index = _local_to_global_index(cu_seqlens, world_size, rank, x.shape[dim] // world_size)
    return x.index_select(dim, index.to(x.device))


def zigzag_unshard(x: torch.Tensor, cu_seqlens: torch.Tensor, world_size: int,
                   dim: int = 0) -> torch.Tensor:
    """Inverse of ``zigzag_shard`` over all ranks: ``x`` is every rank's local tensor concatenated
    rank-major along ``dim`` (what ``all_gather_into_tensor`` gives); returns global order.
    ``cu_seqlens`` int32 ``[batch + 1]`` GLOBAL."""
    if x.shape[dim] % world_size != 0:
        raise ValueError(f"x has {x.shape[dim]} tokens along dim {dim}, not a multiple of "
                         f"world_size={world_size}")
    cu_local = torch.div(cu_seqlens, world_size, rounding_mode="floor")
    index = zigzag_to_contiguous_index(cu_local, world_size, x.shape[dim] // world_size)
    return x.index_select(dim, index.to(x.device))
