"""A/B at the Llama-3-8B zigzag shapes: the in-place zigzag launch with key ranges and output rows
derived in the kernel (ints) vs read from per-sequence int32 tensors (docs/notes.md)."""
import torch
import triton.testing

from kvonce.bench.zigzag import cases, setup
from kvonce.kernels.configs import get_dual_group_fwd_config
from kvonce.kernels.dual_group_fwd import launch_dual_group_fwd

for case in cases("bf16"):
    if "1x8192" not in case.name:
        continue
    s = setup(case, torch.bfloat16)
    (q0, q1), (cu0, cu1), cuk = s["chunk_q"], s["chunk_cu"], s["cu"]
    kv, w = s["kv_buffer"], case.world_size
    c0, c1 = s["c0"], s["c1"]
    cfg = get_dual_group_fwd_config(torch.cuda.get_device_capability(), case.head_dim)
    total = q0.shape[0] + q1.shape[0]
    out = torch.empty((total, case.nheads, case.head_dim), dtype=q0.dtype, device="cuda")
    lse = torch.empty((case.nheads, total), dtype=torch.float32, device="cuda")
    chunk = (cuk[1:] - cuk[:-1]) // 2
    ends = [(chunk * (c + 1)).to(torch.int32) for c in (c0, c1)]
    starts0 = (cu0[:-1] + cu1[:-1]).to(torch.int32)
    starts1 = (starts0 + (cu0[1:] - cu0[:-1])).to(torch.int32)
    common = dict(max_seqlen_q=max(q0.shape[0], q1.shape[0]), softmax_scale=case.head_dim ** -0.5,
                  causal=True, config=cfg, zigzag_world_size=w,
                  zigzag_rank_rows=kv.shape[1] // w)
    ints = lambda: launch_dual_group_fwd(q0, q1, kv[0], kv[1], out, out, lse, lse, cu0, cu1, cuk,
                                         c0 + 1, c1 + 1, cu0, cu1, zigzag_local_order=True,
                                         **common)
    tensors = lambda: launch_dual_group_fwd(q0, q1, kv[0], kv[1], out, out, lse, lse, cu0, cu1,
                                            cuk, ends[0], ends[1], starts0, starts1, **common)
    ints()
    ref = out.clone()
    tensors()
    same = torch.equal(out, ref)
    t = lambda f: triton.testing.do_bench(f, warmup=50, rep=400, return_mode="median")
    times = [(t(ints), t(tensors)) for _ in range(3)]
    hi, ht = ints(), tensors()
    print(f"{case.name}: identical={same} ints {[round(a, 3) for a, _ in times]} ms, "
          f"tensors {[round(b, 3) for _, b in times]} ms; regs/spills ints {hi.n_regs}/"
          f"{hi.n_spills} tensors {ht.n_regs}/{ht.n_spills}", flush=True)
