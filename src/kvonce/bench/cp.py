"""Benchmark: context-parallel zigzag attention over NCCL (CUDA, >= 2 GPUs).

    python -m kvonce bench cp [--world 2] [--strides 1,2,4,8] [--iters 20] [--trace DIR]

Spawns one process per GPU (or runs under torchrun when WORLD_SIZE is set). Configuration:
Llama-3-8B attention, 8192 tokens per GPU, 32/8 heads, d128, bf16, four varlen patterns (below).
Per pattern: forward and forward+backward iterations per second of
``zigzag_llama3_flash_attn_varlen_func`` at each ``heads_k_stride``, and the single-GPU baselines
on the whole (unsharded) batch on rank 0: PyTorch's FA2 varlen (``aten._flash_attention_forward/
_backward``, GQA native) and kvonce's own kernel (the same function at world 1); and, in the same
loop, the seed fork's algorithm (``_OriginalCP``: rearrange, two FA2 calls, bf16 dK/dV). Efficiency = CP iter/s /
(single-GPU iter/s x world): 100% means the CP run is ``world`` times faster than one GPU.
Times: CUDA-event medians over ``--iters`` iterations after warmup, the slowest rank's.
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics

import torch
import torch.distributed as dist

from . import report

TOKENS_PER_GPU, HEADS, HEADS_K, HEAD_DIM = 8192, 32, 8, 128


def patterns(world: int) -> dict[str, list[int]]:
    """Global sequence lengths (each a multiple of 2 * world), summing to world * 8192."""
    total = world * TOKENS_PER_GPU
    unit = 2 * world * 64  # keeps every chunk a multiple of 64 tokens
    mixed = [total // 4, total // 8 * 3, total // 8, total // 16, total // 16, total // 8]
    return {
        "1 x full": [total],
        "4 equal": [total // 4] * 4,
        "6 mixed": mixed,
        "16 short + 1 long": [unit] * 16 + [total - 16 * unit],
    }


def _cu(lens, device):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def _time(fn, iters: int) -> float:
    """Median ms of ``fn`` over ``iters`` runs (CUDA events), after 3 warmup runs."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _slowest(ms: float, world: int) -> float:
    if world == 1:
        return ms
    t = torch.tensor([ms], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _cp_step(q, k, v, cu_local, cu, max_local, stride, backward: bool, dout, group=None):
    from ..zigzag import zigzag_llama3_flash_attn_varlen_func

    def fn():
        out = zigzag_llama3_flash_attn_varlen_func(q, k, v, cu_local, cu, max_local, max_local,
                                                   stride, group=group)
        if backward:
            out.backward(dout)
    return fn


class _OriginalCP(torch.autograd.Function):
    """The seed fork's algorithm, for comparison (bench only): all-gather every KV head at once,
    rearrange the buffer into contiguous order, slice it per group, two FA2 varlen calls, scatter
    to local order; backward: two FA2 backward calls, the groups' dK/dV added in bf16 into a
    contiguous buffer, mapped back to the gathered order and reduce-scattered in bf16. Its host
    metadata (Python lists of key ranges) is built per call, as the original does."""

    @staticmethod
    def forward(ctx, q, k, v, cu_local, world, rank, group):
        from ..zigzag import (compute_kv_slices_for_groups, split_q_by_zigzag_chunk_index,
                              zigzag_to_contiguous_index)

        total = q.shape[0]
        gathered = torch.empty((2, world * total, *k.shape[1:]), dtype=k.dtype, device=k.device)
        dist.all_gather_into_tensor(gathered[0], k.contiguous(), group=group)
        dist.all_gather_into_tensor(gathered[1], v.contiguous(), group=group)
        index = zigzag_to_contiguous_index(cu_local, world, total)
        kv = gathered.index_select(1, index)
        chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu_local, world, rank)
        slices = compute_kv_slices_for_groups(cu_local, rank, 2 * world - 1 - rank, world,
                                              chunk_cu)
        out = torch.empty_like(q)
        saved = []
        for q_g, cu_q, idx, (ranges, cu_k) in zip(chunk_q, chunk_cu, chunk_idx, slices):
            rows = torch.cat([torch.arange(a, b, device=q.device) for a, b in ranges])
            k_g, v_g = kv[0, rows], kv[1, rows]
            # Host maxima, as the original reads them (a sync per group).
            max_q = int((cu_q[1:] - cu_q[:-1]).max()) if cu_q.numel() > 1 else 0
            max_k = max((b - a for a, b in ranges), default=0)
            o_g, lse_g, rng, unused, _ = torch.ops.aten._flash_attention_forward(
                q_g, k_g, v_g, cu_q, cu_k, max_q, max_k, 0.0, True, False,
                scale=HEAD_DIM ** -0.5)
            out[idx] = o_g
            saved.append((q_g, k_g, v_g, o_g, lse_g, rng, unused, cu_q, cu_k, max_q, max_k,
                          rows, idx))
        ctx.saved = saved
        ctx.meta = (index, world, rank, group, k.shape)
        return out

    @staticmethod
    def backward(ctx, dout):
        index, world, rank, group, k_shape = ctx.meta
        dq = torch.empty_like(dout)
        dkv = torch.zeros((2, world * k_shape[0], *k_shape[1:]), dtype=dout.dtype,
                          device=dout.device)  # bf16 accumulation, as the original
        for q_g, k_g, v_g, o_g, lse_g, rng, unused, cu_q, cu_k, mq, mk, rows, idx in ctx.saved:
            dq_g, dk_g, dv_g = torch.ops.aten._flash_attention_backward(
                dout[idx], q_g, k_g, v_g, o_g, lse_g, cu_q, cu_k, mq, mk, 0.0, True, rng,
                unused, scale=HEAD_DIM ** -0.5)
            dq[idx] = dq_g
            dkv[0].index_add_(0, rows, dk_g)
            dkv[1].index_add_(0, rows, dv_g)
        in_buffer = torch.empty_like(dkv)
        in_buffer[:, index] = dkv  # back to the gathered (rank-major) order
        dk = torch.empty(k_shape, dtype=dout.dtype, device=dout.device)
        dv = torch.empty_like(dk)
        dist.reduce_scatter_tensor(dk, in_buffer[0], group=group)
        dist.reduce_scatter_tensor(dv, in_buffer[1], group=group)
        return dq, dk, dv, None, None, None, None


def _original_step(q, k, v, cu_local, world, rank, backward: bool, dout):
    def fn():
        out = _OriginalCP.apply(q, k, v, cu_local, world, rank, None)
        if backward:
            out.backward(dout)
    return fn


def _fa2_step(q, k, v, cu, max_len, backward: bool, dout):
    def fn():
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=HEAD_DIM ** -0.5)
        if backward:
            torch.ops.aten._flash_attention_backward(
                dout, q, k, v, out, lse, cu, cu, max_len, max_len, 0.0, True, rng, unused,
                scale=HEAD_DIM ** -0.5)
    return fn


def _single_gpu(lens, iters: int, alone) -> dict:
    """Single-GPU ms of FA2 and kvonce (world 1: the process group ``alone`` of this rank only)
    on the whole batch: fwd and fwd+bwd."""
    torch.manual_seed(0)
    cu = _cu(lens, "cuda")
    total = sum(lens)
    q = torch.randn(total, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(total, HEADS_K, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    res = {}
    for bwd in (False, True):
        tag = "fwd+bwd" if bwd else "fwd"
        res[f"fa2 {tag}"] = _time(_fa2_step(q, k, v, cu, max(lens), bwd, dout), iters)
        res[f"kvonce {tag}"] = _time(_cp_step(*leaves, cu, cu, max(lens), HEADS_K, bwd, dout,
                                              alone), iters)
    return res


def _worker(rank: int, world: int, args) -> list[dict]:
    from ..zigzag import zigzag_shard

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    # Every rank takes part in creating each one-rank group (new_group is collective).
    alone = [dist.new_group([r]) for r in range(world)][rank] if world > 1 else None
    rows = []
    strides = [s for s in (int(x) for x in args.strides.split(",")) if HEADS_K % s == 0]
    for name, lens in patterns(world).items():
        torch.manual_seed(0)
        cu = _cu(lens, device)
        total = sum(lens)
        Q = torch.randn(total, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
        K, V = (torch.randn(total, HEADS_K, HEAD_DIM, device=device, dtype=torch.bfloat16)
                for _ in range(2))
        q, k, v, dout = (zigzag_shard(t, cu, world, rank) for t in (Q, K, V, torch.randn_like(Q)))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        local_lens = [n // world for n in lens]
        cu_local = _cu(local_lens, device)
        _agreement(name, q, k, v, dout, cu_local, cu, max(local_lens), world, rank)
        single = _single_gpu(lens, args.iters, alone) if rank == 0 else {}
        row = {"pattern": name}
        for stride in strides:
            for bwd in (False, True):
                tag = "fwd+bwd" if bwd else "fwd"
                ms = _slowest(_time(_cp_step(*leaves, cu_local, cu, max(local_lens), stride, bwd,
                                             dout), args.iters), world)
                row[f"s{stride} {tag} it/s"] = 1e3 / ms
                if rank == 0:
                    row[f"s{stride} {tag} eff vs FA2 %"] = 100 * single[f"fa2 {tag}"] / (ms * world)
                    row[f"s{stride} {tag} eff vs kvonce %"] = (
                        100 * single[f"kvonce {tag}"] / (ms * world))
        for bwd in (False, True):
            tag = "fwd+bwd" if bwd else "fwd"
            ms = _slowest(_time(_original_step(*leaves, cu_local, world, rank, bwd, dout),
                                args.iters), world)
            row[f"original {tag} it/s"] = 1e3 / ms
        best = max(row[f"s{s} fwd+bwd it/s"] for s in strides)
        row["best fwd+bwd / original"] = best / row["original fwd+bwd it/s"]
        if rank == 0:
            for key, ms in single.items():
                row[f"1-GPU {key} it/s"] = 1e3 / ms
            print(report.format_rows([row]), flush=True)
        rows.append(row)
        if args.trace and name == "1 x full":
            _trace(leaves, cu_local, cu, max(local_lens), strides[0], dout, args.trace, rank)
    return rows


def _agreement(name, q, k, v, dout, cu_local, cu, max_local, world, rank) -> None:
    """Print (rank 0) the relative differences of out, dq, dk, dv between kvonce's CP function and
    the original path on the same inputs: both must compute the same attention."""
    results = []
    for step in ("kvonce", "original"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if step == "kvonce":
            from ..zigzag import zigzag_llama3_flash_attn_varlen_func

            out = zigzag_llama3_flash_attn_varlen_func(*leaves, cu_local, cu, max_local,
                                                       max_local, HEADS_K)
        else:
            out = _OriginalCP.apply(*leaves, cu_local, world, rank, None)
        out.backward(dout)
        results.append([out.detach()] + [t.grad for t in leaves])
    if rank == 0:
        diffs = [((a.float() - b.float()).norm() / b.float().norm()).item()
                 for a, b in zip(*results)]
        print(f"{name}: kvonce vs original rel. diff out {diffs[0]:.1e} dq {diffs[1]:.1e} "
              f"dk {diffs[2]:.1e} dv {diffs[3]:.1e}", flush=True)


def _trace(leaves, cu_local, cu, max_local, stride, dout, out_dir, rank):
    """A torch.profiler chrome trace of one fwd+bwd step per rank, and the share of NCCL kernel
    time that overlaps a compute kernel (printed)."""
    from torch.profiler import ProfilerActivity, profile

    fn = _cp_step(*leaves, cu_local, cu, max_local, stride, True, dout)
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    os.makedirs(out_dir, exist_ok=True)
    prof.export_chrome_trace(os.path.join(out_dir, f"cp_trace_rank{rank}.json"))
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    comm = [(e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower()]
    comp = [(e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower()]
    total = sum(b - a for a, b in comm)
    overlap = 0
    for a, b in comm:
        covered = sorted((max(a, c), min(b, d)) for c, d in comp if c < b and d > a)
        end = a
        for c, d in covered:
            if d > end:
                overlap += d - max(c, end)
                end = d
    print(f"rank {rank}: NCCL kernels {total / 1e3:.2f} ms, {100 * overlap / max(total, 1):.0f}% "
          "of it overlapped with compute kernels", flush=True)


def _spawned(rank: int, world: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        rows = _worker(rank, world, args)
        if rank == 0:
            print()
            print(report.format_rows(rows))
            if not args.no_docs:
                report.append_markdown(
                    os.path.join(args.out, "benchmarks.md"),
                    f"Context-parallel zigzag attention, world {world}", rows,
                    command="python -m kvonce bench cp " + " ".join(args.argv), dtype="bf16",
                    date=datetime.date.today().isoformat())
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvonce bench cp")
    ap.add_argument("--world", type=int, default=0, help="GPUs (default: all visible)")
    ap.add_argument("--strides", default="1,2,4,8", help="heads_k_stride values")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--trace", default="", help="directory for per-rank profiler traces")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args(argv)
    args.argv = argv
    if not torch.cuda.is_available():
        raise SystemExit("bench cp needs CUDA GPUs")
    if "WORLD_SIZE" in os.environ:  # torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _spawned_torchrun(rank, world, args)
        return
    world = args.world or torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_spawned, args=(world, port, args), nprocs=world, join=True)


def _spawned_torchrun(rank: int, world: int, args) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    _spawned(rank, world, int(os.environ.get("MASTER_PORT", "29500")), args)
