"""Zigzag llama3 context parallelism on torch.distributed: forward, backward, overlap.

Every sequence's tokens are spread over the ranks of a process group in the zigzag layout (rank
``r`` holds chunks ``r`` and ``2 * world - 1 - r`` of each sequence, ``layout.py``). Per stride of
``heads_k_stride`` KV heads:

- forward: the next stride's K and V are all-gathered (async, into the other of two buffers) while
  the fused dual-group kernel computes the current stride straight from the rank-major gathered
  buffer: both of this rank's query groups in one launch, each K/V tile read once, outputs written
  in local order. No rearranging copy, no metadata tensors (key ranges and rows are derived in the
  kernel from the local ``cu_seqlens``), no host sync.
- backward: K/V are gathered again per stride (overlapped the same way), the fused backward writes
  dK/dV of the whole gathered buffer in fp32, and an async reduce-scatter returns each rank its
  own rows while the next stride computes; dQ stays local. dK/dV are cast to the input dtype once,
  at the end.

The whole forward and the whole backward are one ``torch.library`` custom op each
(``kvonce::zigzag_cp_fwd`` / ``kvonce::zigzag_cp_bwd``, the process group passed by name), so
``torch.compile(fullgraph=True)`` of a model that calls them sees two opaque nodes.

On gloo (CPU tests) collectives gloo lacks are replaced by equivalents, said where they are.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from .. import _validate as V
from ..kernels.configs import get_dual_group_bwd_config, get_dual_group_fwd_config, interpreter_active
from ..kernels.dual_group_fwd import launch_dual_group_fwd
from ..varlen import _capability, bwd_launcher
from .grouped import check_unsupported_features

__all__ = [
    "zigzag_llama3_flash_attn_varlen_func",
    "zigzag_llama3_flash_attn_varlen_kvpacked_func",
    "zigzag_llama3_flash_attn_varlen_qkvpacked_func",
]


# ------------------------------------------------------------------------------------ groups
def _group_name(group) -> str:
    """The name a custom op carries for ``group`` ("" when torch.distributed is not in use:
    world 1)."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialized")
        return ""
    return (group if group is not None else dist.group.WORLD).group_name


def _resolve(group_name: str):
    """``(group, world_size, rank)``; ``(None, 1, 0)`` for ""."""
    if not group_name:
        return None, 1, 0
    group = dist.distributed_c10d._resolve_process_group(group_name)
    return group, dist.get_world_size(group), dist.get_rank(group)


def _is_gloo(group) -> bool:
    return group is not None and dist.get_backend(group) == "gloo"


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group, world: int):
    """``out[r * n : (r + 1) * n] = inp`` of rank ``r``; returns a work handle (or None)."""
    if world == 1:
        out.copy_(inp)
        return None
    if _is_gloo(group):  # gloo: all_gather into the rank chunks of out (views; same result)
        dist.all_gather(list(out.chunk(world)), inp, group=group)
        return None
    return dist.all_gather_into_tensor(out, inp, group=group, async_op=True)


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group, world: int, rank: int):
    """``out = sum over ranks of inp[rank * n : (rank + 1) * n]``; returns a work handle (or
    None)."""
    if world == 1:
        out.copy_(inp)
        return None
    if _is_gloo(group):  # gloo has no reduce_scatter: all-reduce, then take this rank's rows
        dist.all_reduce(inp, group=group)
        out.copy_(inp.chunk(world)[rank])
        return None
    return dist.reduce_scatter_tensor(out, inp, group=group, async_op=True)


def _wait(works) -> None:
    for w in works:
        if w is not None:
            w.wait()


# ------------------------------------------------------------------------------------ forward
def _gather_stride(k, v, s: int, stride: int, buf: torch.Tensor, group, world: int) -> list:
    """All-gather K/V heads ``[s * stride, (s + 1) * stride)`` into ``buf [2, world * T, stride,
    d]`` (rank-major). Async on NCCL: the collective's stream waits for the work queued so far,
    so a buffer is never overwritten while a kernel still reads it."""
    heads = slice(s * stride, (s + 1) * stride)
    return [_all_gather(buf[0], k[:, heads].contiguous(), group, world),
            _all_gather(buf[1], v[:, heads].contiguous(), group, world)]


def _kept_shape(q, k, heads_k_stride: int, world: int, keep_kv: bool) -> tuple[int, ...]:
    """Shape of the gathered K/V the forward keeps for the backward (``(0,)``: none kept)."""
    if not keep_kv:
        return (0,)
    return (k.shape[1] // heads_k_stride, 2, world * q.shape[0], heads_k_stride, k.shape[2])


def _cp_fwd_impl(q, k, v, cu_seqlens, heads_k_stride, max_chunk, softmax_scale, causal,
                 group_name, keep_kv):
    group, world, rank = _resolve(group_name)
    total, nheads, head_dim = q.shape
    nheads_k = k.shape[1]
    q_per_kv = nheads // nheads_k
    out = torch.empty_like(q)
    lse = torch.empty((nheads, total), dtype=torch.float32, device=q.device)
    cu_half = torch.div(cu_seqlens, 2, rounding_mode="floor")  # each group's cumulative rows
    config = get_dual_group_fwd_config(_capability(q.device), head_dim, zigzag_buffer=True,
                                       element_size=q.element_size())
    n_strides = nheads_k // heads_k_stride
    kept = k.new_empty(_kept_shape(q, k, heads_k_stride, world, keep_kv))
    if keep_kv:  # one buffer per stride, all kept for the backward
        bufs = list(kept.unbind(0))
    else:  # two buffers, alternating
        bufs = [torch.empty((2, world * total, heads_k_stride, head_dim), dtype=k.dtype,
                            device=k.device) for _ in range(min(2, n_strides))]
    works = _gather_stride(k, v, 0, heads_k_stride, bufs[0], group, world)
    for s in range(n_strides):
        buf = bufs[s % len(bufs)]
        _wait(works)
        if s + 1 < n_strides:  # the next stride's gather overlaps this stride's kernel
            works = _gather_stride(k, v, s + 1, heads_k_stride, bufs[(s + 1) % len(bufs)], group,
                                   world)
        heads = slice(s * heads_k_stride * q_per_kv, (s + 1) * heads_k_stride * q_per_kv)
        q_s, out_s, lse_s = q[:, heads], out[:, heads], lse[heads]
        launch_dual_group_fwd(
            q_s, q_s, buf[0], buf[1], out_s, out_s, lse_s, lse_s, cu_half, cu_half, cu_seqlens,
            rank + 1, 2 * world - rank, cu_half, cu_half, max_seqlen_q=max_chunk,
            softmax_scale=softmax_scale, causal=causal, config=config, zigzag_world_size=world,
            zigzag_rank_rows=total, zigzag_local_order=True, q_local_order=True)
    return out, lse, kept


@torch.library.custom_op("kvonce::zigzag_cp_fwd", mutates_args=())
def _cp_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
               heads_k_stride: int, max_chunk: int, softmax_scale: float, causal: bool,
               group_name: str, keep_kv: bool, deterministic: bool = False,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Context-parallel zigzag attention forward of one rank: ``(out [T, nheads, d],
    lse float32 [nheads, T], kept)`` in local order. ``cu_seqlens`` LOCAL int32, ``max_chunk``
    bounds each sequence's chunk length (half its local length). ``kept``: with ``keep_kv`` the
    gathered K/V of every stride ``[strides, 2, world * T, stride, d]`` (the backward then
    gathers nothing), else an empty ``[0]``. ``deterministic`` is the backward's (passed on to
    ``kvonce::zigzag_cp_bwd``), unused here."""
    return _cp_fwd_impl(q, k, v, cu_seqlens, heads_k_stride, max_chunk, softmax_scale, causal,
                        group_name, keep_kv)


@_cp_fwd_op.register_fake
def _(q, k, v, cu_seqlens, heads_k_stride, max_chunk, softmax_scale, causal, group_name, keep_kv,
      deterministic=False):
    world = _resolve(group_name)[1]
    return (torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32),
            k.new_empty(_kept_shape(q, k, heads_k_stride, world, keep_kv)))


# ------------------------------------------------------------------------------------ backward
def _cp_bwd_impl(dout, q, k, v, out, lse, kept, cu_seqlens, heads_k_stride, max_chunk,
                 softmax_scale, causal, group_name, deterministic):
    group, world, rank = _resolve(group_name)
    total, nheads, head_dim = q.shape
    nheads_k = k.shape[1]
    q_per_kv = nheads // nheads_k
    n_strides = nheads_k // heads_k_stride
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    dq = torch.empty_like(q)
    delta = torch.empty_like(lse)
    # This rank's dK/dV, stride-major in fp32 until the single cast at the end.
    dkv_local = torch.empty((2, n_strides, total, heads_k_stride, head_dim), dtype=torch.float32,
                            device=k.device)
    cu_half = torch.div(cu_seqlens, 2, rounding_mode="floor")
    config = get_dual_group_bwd_config(_capability(q.device), head_dim, q.element_size())
    if deterministic and config.gluon:  # the two Triton kernels: bitwise reproducible
        config = dataclasses.replace(config, gluon=False)
    n_bufs = min(2, n_strides)
    if kept.numel() == 0:
        bufs = [torch.empty((2, world * total, heads_k_stride, head_dim), dtype=k.dtype,
                            device=k.device) for _ in range(n_bufs)]
    else:  # the forward kept every stride's gathered K/V: nothing to gather
        bufs = list(kept.unbind(0))
    dkv_bufs = [torch.empty((2, world * total, heads_k_stride, head_dim), dtype=torch.float32,
                            device=k.device) for _ in range(n_bufs)]
    scatters: list = [[], []]
    gather = kept.numel() == 0
    works = _gather_stride(k, v, 0, heads_k_stride, bufs[0], group, world) if gather else []
    for s in range(n_strides):
        buf, dkv = bufs[s % len(bufs)], dkv_bufs[s % 2]
        _wait(works)
        _wait(scatters[s % 2])  # the reduce-scatter of stride s - 2 read this dK/dV buffer
        if gather and s + 1 < n_strides:
            works = _gather_stride(k, v, s + 1, heads_k_stride, bufs[(s + 1) % 2], group, world)
        heads = slice(s * heads_k_stride * q_per_kv, (s + 1) * heads_k_stride * q_per_kv)
        q_s, out_s, dout_s = q[:, heads], out[:, heads], dout[:, heads]
        lse_s, delta_s, dq_s = lse[heads], delta[heads], dq[:, heads]
        # Chosen per stride: supports() looks at the views' alignment.
        launch = bwd_launcher(config, q_s, q_s, buf[0], buf[1], out_s, out_s, dout_s, dout_s,
                              lse_s, lse_s, dq_s, dq_s, dkv[0], dkv[1], zigzag_world_size=world,
                              local_order=True)
        launch(
            q_s, q_s, buf[0], buf[1], out_s, out_s, dout_s, dout_s, lse_s, lse_s, delta_s,
            delta_s, dq_s, dq_s, dkv[0], dkv[1], cu_half, cu_half, cu_seqlens, rank + 1,
            2 * world - rank, max_seqlen_q=max_chunk, max_seqlen_k=2 * world * max_chunk,
            softmax_scale=softmax_scale, causal=causal, config=config, zigzag_world_size=world,
            local_order=True)
        # Each rank's rows of the rank-major buffer are its own keys: a plain reduce-scatter.
        scatters[s % 2] = [_reduce_scatter(dkv_local[0, s], dkv[0], group, world, rank),
                           _reduce_scatter(dkv_local[1, s], dkv[1], group, world, rank)]
    _wait(scatters[0])
    _wait(scatters[1])
    # [2, strides, T, stride, d] -> [T, nheads_k, d] per tensor, cast once.
    dkv_local = dkv_local.permute(0, 2, 1, 3, 4).reshape(2, total, nheads_k, head_dim)
    # (The reshape may stay a strided view: the cast writes fresh contiguous tensors, as the
    # fake implementation says.)
    contiguous = torch.contiguous_format
    return (dq, dkv_local[0].to(k.dtype, copy=True, memory_format=contiguous),
            dkv_local[1].to(v.dtype, copy=True, memory_format=contiguous))


@torch.library.custom_op("kvonce::zigzag_cp_bwd", mutates_args=())
def _cp_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor, lse: torch.Tensor, kept: torch.Tensor, cu_seqlens: torch.Tensor,
               heads_k_stride: int, max_chunk: int, softmax_scale: float, causal: bool,
               group_name: str, deterministic: bool = False,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of ``kvonce::zigzag_cp_fwd``: ``(dq, dk, dv)`` of this rank's local tokens, dK/dV
    summed over every rank's queries in fp32 and cast once. ``deterministic``: the two Triton
    kernels (bitwise reproducible) even where the config row takes the Gluon kernel."""
    return _cp_bwd_impl(dout, q, k, v, out, lse, kept, cu_seqlens, heads_k_stride, max_chunk,
                        softmax_scale, causal, group_name, deterministic)


@_cp_bwd_op.register_fake
def _(dout, q, k, v, out, lse, kept, cu_seqlens, heads_k_stride, max_chunk, softmax_scale,
      causal, group_name, deterministic=False):
    # dK/dV come back contiguous whatever k/v's strides (the real op reshapes a fresh buffer).
    return (torch.empty_like(q), k.new_empty(k.shape), v.new_empty(v.shape))


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens, heads_k_stride, max_chunk, softmax_scale, causal, group_name, _keep_kv,
     *rest) = inputs
    deterministic = bool(rest[0]) if rest else False  # a trailing default may be left out
    out, lse, kept = output
    ctx.save_for_backward(q, k, v, out, lse, kept, cu_seqlens)
    ctx.args = (heads_k_stride, max_chunk, softmax_scale, causal, group_name, deterministic)
    ctx.num_inputs = len(inputs)
    ctx.mark_non_differentiable(lse, kept)


def _backward(ctx, dout, _dlse, _dkept):
    q, k, v, out, lse, kept, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = torch.ops.kvonce.zigzag_cp_bwd(dout, q, k, v, out, lse, kept, cu_seqlens,
                                                *ctx.args)
    return (dq, dk, dv) + (None,) * (ctx.num_inputs - 3)


torch.library.register_autograd("kvonce::zigzag_cp_fwd", _backward, setup_context=_setup_context)


# ------------------------------------------------------------------------------------ public API
def _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, heads_k_stride) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        V.check_tensor(name, t, ndim=3, dtypes=V.ATTN_DTYPES)
    V.check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    V.check_same_dtype(q=q, k=k, v=v)
    batch = V.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
    V.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, batch)
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"k and v must be [total_local, nheads_k, d] with q's tokens and head "
                         f"dim: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    V.check_head_dim("q", q.shape[2])
    V.check_gqa(q.shape[1], k.shape[1])
    V.check_last_dim_contiguous(q=q, k=k, v=v)
    V.check_nonnegative_int("max_seqlen_q", max_seqlen_q)
    if (isinstance(heads_k_stride, bool) or not isinstance(heads_k_stride, int)
            or heads_k_stride < 1 or k.shape[1] % heads_k_stride != 0):
        raise ValueError(f"heads_k_stride must be a positive divisor of nheads_k={k.shape[1]}, "
                         f"got {heads_k_stride!r}")
    # meta tensors: the function always calls its op, whose fake implementation serves them.
    if q.device.type not in ("cuda", "meta") and not interpreter_active():
        raise ValueError(f"inputs are on {q.device}: the Triton kernels need a CUDA device "
                         "(or TRITON_INTERPRET=1 for the CPU interpreter)")


def _check_zigzag_lengths(cu_seqlens_k: torch.Tensor, world: int,
                         cu_seqlens_q: torch.Tensor | None = None) -> None:
    """Validation mode (reads the tensors: a host sync). Every GLOBAL length in ``cu_seqlens_k``
    must be a multiple of ``2 * world`` (the zigzag chunks; any other length gives wrong results
    silently), and with ``cu_seqlens_q`` every LOCAL length must be the global one // ``world``.
    Raises ValueError naming the first bad sequence."""
    if cu_seqlens_q is None:
        cu_k, cu_q = cu_seqlens_k.tolist(), None  # sync-ok: check_lengths (validation mode)
    else:  # one transfer for both
        cu_q, cu_k = torch.stack([cu_seqlens_q, cu_seqlens_k]).tolist()  # sync-ok: check_lengths
    for b in range(len(cu_k) - 1):
        n = cu_k[b + 1] - cu_k[b]
        if n % (2 * world) != 0:
            raise ValueError(f"cu_seqlens_k: sequence {b} has global length {n}, not a multiple "
                             f"of 2 * world_size = {2 * world}")
        local = None if cu_q is None else cu_q[b + 1] - cu_q[b]
        if local is not None and local != n // world:
            raise ValueError(f"cu_seqlens_q: sequence {b} has local length {local}, expected its "
                             f"global length {n} // world_size {world} = {n // world}")


def zigzag_llama3_flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    heads_k_stride: int,
    local_k_slice=None,
    softmax_scale: float | None = None,
    dropout_p: float = 0.0,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes=None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group=None,
    *,
    keep_gathered_kv: bool = False,
    check_lengths: bool = False,
):
    """Zigzag llama3 context-parallel varlen attention (ring-flash-attention's and the seed fork's
    signature): differentiable in q, k, v.

    Parameters
    ----------
    q : ``[total_local, nheads, d]``; k, v : ``[total_local, nheads_k, d]``: this rank's zigzag
        tokens (sequence ``b`` holds chunk ``rank`` then chunk ``2 * world - 1 - rank``).
    cu_seqlens_q : int32 ``[batch + 1]``, LOCAL cumulative lengths (each local length even).
    cu_seqlens_k : int32 ``[batch + 1]``, GLOBAL (every global length a multiple of
        ``2 * world``, and ``cu_seqlens_q == cu_seqlens_k // world``: other lengths give wrong
        results silently). Checked for shape only unless ``check_lengths``: the key ranges come
        from ``cu_seqlens_q``.
    max_seqlen_q : bound of the LOCAL lengths (sizes the grids; a larger value is only slower).
    max_seqlen_k : accepted for parity (unused).
    heads_k_stride : KV heads gathered and computed per step (must divide ``nheads_k``): smaller
        strides overlap more and use less memory for the gathered buffers.
    local_k_slice : accepted for parity with the fork (unused: the key ranges are derived on the
        device from ``cu_seqlens_q``).
    softmax_scale : default ``d ** -0.5``. causal : bottom-right within each sequence (global
        positions).
    deterministic : the backward takes the two Triton kernels, bitwise reproducible run to run
        (flash-attn's switch); by default Hopper at head dims 64/128 runs the Gluon kernel, whose
        fp32 dQ sum order varies.
    dropout_p, window_size, alibi_slopes : must be 0.0, (-1, -1), None (NotImplementedError).
    group : the process group (default: WORLD; torch.distributed not initialized: world 1).
    keep_gathered_kv : keep every stride's gathered K/V from the forward for the backward
        (``world x`` the local K/V in memory, no all-gather in the backward). Default: gather
        again in the backward (overlapped with its compute).
    check_lengths : validation mode, off by default because it reads ``cu_seqlens_q`` and
        ``cu_seqlens_k`` on the host (a sync; not capturable, a graph break under torch.compile):
        raises ValueError naming the first sequence whose global length is not a multiple of
        ``2 * world`` or whose local length is not the global one // ``world``.

    Returns
    -------
    out ``[total_local, nheads, d]``; with ``return_attn_probs``: ``(out, lse, None)``, lse float32
    ``[nheads, total_local]`` (natural log, not differentiable).
    """
    check_unsupported_features(dropout_p, window_size, alibi_slopes)
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, heads_k_stride)
    group_name = _group_name(group)
    if check_lengths:
        _check_zigzag_lengths(cu_seqlens_k, _resolve(group_name)[1], cu_seqlens_q)
    scale = q.shape[2] ** -0.5 if softmax_scale is None else float(softmax_scale)
    max_chunk = min(max_seqlen_q, q.shape[0]) // 2
    out, lse, _ = torch.ops.kvonce.zigzag_cp_fwd(q, k, v, cu_seqlens_q, heads_k_stride, max_chunk,
                                                 scale, causal, group_name, keep_gathered_kv,
                                                 bool(deterministic))
    return (out, lse, None) if return_attn_probs else out


def zigzag_llama3_flash_attn_varlen_kvpacked_func(
    q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
    local_k_slice=None, softmax_scale=None, dropout_p=0.0, causal=True, window_size=(-1, -1),
    alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None, *,
    keep_gathered_kv=False, check_lengths=False,
):
    """``zigzag_llama3_flash_attn_varlen_func`` with ``kv [total_local, 2, nheads_k, d]``."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv must be [total_local, 2, nheads_k, d], got "
                         f"{tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv)}")
    return zigzag_llama3_flash_attn_varlen_func(
        q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        heads_k_stride, local_k_slice, softmax_scale, dropout_p, causal, window_size,
        alibi_slopes, deterministic, return_attn_probs, group, keep_gathered_kv=keep_gathered_kv,
        check_lengths=check_lengths)


def zigzag_llama3_flash_attn_varlen_qkvpacked_func(
    qkv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, heads_k_stride,
    local_k_slice=None, softmax_scale=None, dropout_p=0.0, causal=True, window_size=(-1, -1),
    alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None, *,
    keep_gathered_kv=False, check_lengths=False,
):
    """``zigzag_llama3_flash_attn_varlen_func`` with ``qkv [total_local, 3, nheads, d]`` (MHA)."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv must be [total_local, 3, nheads, d], got "
                         f"{tuple(qkv.shape) if isinstance(qkv, torch.Tensor) else type(qkv)}")
    return zigzag_llama3_flash_attn_varlen_func(
        qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        heads_k_stride, local_k_slice, softmax_scale, dropout_p, causal, window_size,
        alibi_slopes, deterministic, return_attn_probs, group, keep_gathered_kv=keep_gathered_kv,
        check_lengths=check_lengths)
