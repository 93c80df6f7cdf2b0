"""``python -m kvonce demo``: the zigzag llama3 fused forward on one rank, checked and measured.

On a CUDA GPU: the Llama-3-8B context-parallel shape (world 8, 8192 local tokens, 32 q / 8 kv
heads, head dim 128, bf16) for rank 3, checked against the original two-call path and timed
against it. On a CPU: a small shape under the Triton interpreter (set TRITON_INTERPRET=1; `make
demo` does), checked against the two-call path, with the K/V bytes each path reads.
"""
from __future__ import annotations

import itertools
import time

import torch

from .kernels.configs import get_dual_group_fwd_config, interpreter_active
from .zigzag import (
    compute_kv_slices_for_groups,
    execute_grouped_attention,
    replace_execute_grouped_attention_with_fused_varlen,
    split_q_by_zigzag_chunk_index,
)


def _kv_tile_bytes(local_lens, rank, world_size, nheads, head_dim, elem, block_m, block_n):
    """K/V bytes the attention programs load: per (sequence, head, M-block) program, the fused
    kernel loads each key tile up to the longer group's causal limit once; the two-call path loads
    each group's tiles separately."""
    fused = two = 0
    for local in local_lens:
        c = local // 2
        ends = ((rank + 1) * c, (2 * world_size - rank) * c)
        for m0 in range(0, c, block_m):
            rows_end = min(m0 + block_m, c)
            his = [min(e, rows_end + e - c) for e in ends]
            tiles = [-(-h // block_n) for h in his]
            fused += max(tiles)
            two += sum(tiles)
    per_tile = 2 * block_n * head_dim * elem * nheads
    return fused * per_tile, two * per_tile


def main(argv: list[str]) -> None:
    cuda = torch.cuda.is_available()
    if not cuda and not interpreter_active():
        raise SystemExit("no CUDA GPU: run with TRITON_INTERPRET=1 (make demo does) for the CPU demo")
    device = "cuda" if cuda else "cpu"
    if cuda:
        world_size, rank, local_lens, nheads, nheads_k, head_dim = 8, 3, (8192,), 32, 8, 128
        dtype = torch.bfloat16
    else:
        world_size, rank, local_lens, nheads, nheads_k, head_dim = 4, 1, (128, 64), 2, 1, 64
        dtype = torch.float16
    torch.manual_seed(0)
    cu = torch.tensor([0, *itertools.accumulate(local_lens)], dtype=torch.int32, device=device)
    total = sum(local_lens)
    q = torch.randn(total, nheads, head_dim, dtype=dtype, device=device)
    kv_buffer = torch.randn(2, world_size * total, nheads_k, head_dim, dtype=dtype, device=device)
    c0, c1 = rank, 2 * world_size - 1 - rank
    print(f"zigzag llama3, world {world_size}, rank {rank} (chunks {c0} and {c1}), local lengths "
          f"{list(local_lens)}, {nheads} q / {nheads_k} kv heads, head dim {head_dim}, {dtype}, "
          f"{'CUDA: ' + torch.cuda.get_device_name() if cuda else 'CPU, Triton interpreter'}")
    chunk_q, chunk_cu, chunk_idx = split_q_by_zigzag_chunk_index(q, cu, world_size, rank)
    slices = compute_kv_slices_for_groups(cu, c0, c1, world_size, chunk_cu)
    args = (chunk_q, chunk_cu, chunk_idx, kv_buffer, slices, nheads, head_dim, None, 0.0, True,
            (-1, -1), None, False, world_size, cu)
    out_ref, lse_ref, _ = execute_grouped_attention(*args)
    out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(*args, c0, c1)
    err = ((out.float() - out_ref.float()).norm() / out_ref.float().norm()).item()  # sync-ok: demo check
    lse_err = (lse - lse_ref).abs().max().item()  # sync-ok: demo check
    ok = err < 2e-2 and lse_err < 1e-2 and not torch.isnan(out).any().item()  # sync-ok
    print(f"fused vs two-call path: relative error {err:.2e}, max |lse diff| {lse_err:.2e} -> "
          f"{'OK' if ok else 'MISMATCH'}")
    if cuda:
        import triton.testing

        t_ref = triton.testing.do_bench(lambda: execute_grouped_attention(*args), return_mode="median")
        t_new = triton.testing.do_bench(
            lambda: replace_execute_grouped_attention_with_fused_varlen(*args, c0, c1),
            return_mode="median")
        print(f"two-call path {t_ref:.3f} ms, fused {t_new:.3f} ms: {t_ref / t_new:.2f}x")
    else:
        cfg = get_dual_group_fwd_config(None, head_dim)
        fused, two = _kv_tile_bytes(local_lens, rank, world_size, nheads, head_dim,
                                    torch.finfo(dtype).bits // 8, cfg.block_m, cfg.block_n)
        t = time.perf_counter()
        replace_execute_grouped_attention_with_fused_varlen(*args, c0, c1)
        print(f"K/V bytes loaded by the attention programs: fused {fused / 1e3:.1f} kB, two calls "
              f"{two / 1e3:.1f} kB ({two / fused:.2f}x); the two-call path also copies the whole "
              f"buffer once to rearrange it ({kv_buffer.numel() * kv_buffer.element_size() / 1e3:.1f} "
              f"kB read + written). Interpreter run: {time.perf_counter() - t:.1f} s")
    if not ok:
        raise SystemExit(1)
