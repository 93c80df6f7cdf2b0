"""The torch.library custom ops (torch.ops.kvonce.*) and torch.compile of every public entry point.

On CPU under the Triton interpreter: ``torch.library.opcheck`` of each op (schema and declared
mutations, fake-tensor shapes, autograd registration, AOT dispatch), and
``torch.compile(fullgraph=True, backend="aot_eager")`` of a function calling each public entry
point, compared with the eager call. On the GPU additionally Inductor (the default backend),
``PagedDecodePlan.run`` captured in a CUDA graph inside a compiled function, and the eager launch
path's fallbacks (another stride layout, a misaligned view).
"""
from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import kvonce
import kvonce.paged.decode as decode
from kvonce.kernels import _launch
from kvonce.kernels.configs import interpreter_active
from kvonce.kernels.paged_decode import _paged_decode_kernel
from kvonce.reference import paged_attention_sdpa_ref
from kvonce.zigzag import replace_execute_grouped_attention_with_fused_varlen, split_q_by_zigzag_chunk_index

pytestmark = pytest.mark.skipif(not HAS_CUDA and not interpreter_active(),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")
gpu_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (Inductor, CUDA graphs)")
DTYPE = torch.float16
BACKENDS = ["aot_eager", "inductor"] if HAS_CUDA else ["aot_eager"]


def randn(*shape, dtype=DTYPE):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def paged_inputs(batch=2, lens=(37, 50), q_len=1, nheads=4, nheads_k=2, head_dim=32, page=16,
                 seed=0):
    """A small paged cache with pages in random order, room for a few appended tokens."""
    torch.manual_seed(seed)
    pages_per_seq = max(lens) // page + 2
    num_pages = batch * pages_per_seq
    table = torch.randperm(num_pages).to(torch.int32).view(batch, pages_per_seq).to(DEVICE)
    k_cache = randn(num_pages, page, nheads_k, head_dim)
    v_cache = randn(num_pages, page, nheads_k, head_dim)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = randn(batch, q_len, nheads, head_dim)
    return q, k_cache, v_cache, seqlens, table


def zigzag_inputs(world=2, rank=0, local_lens=(8, 12), nheads=4, nheads_k=2, head_dim=32):
    """Rank ``rank``'s q split into its two zigzag groups and the gathered K/V buffer."""
    torch.manual_seed(1)
    cu_local = torch.tensor([0, *torch.tensor(local_lens).cumsum(0).tolist()], dtype=torch.int32,
                            device=DEVICE)
    total = int(cu_local[-1])
    q = randn(total, nheads, head_dim)
    kv_buffer = randn(2, world * total, nheads_k, head_dim)
    chunk_idx = (rank, 2 * world - 1 - rank)
    q_list, cu_q_list, idx_list = split_q_by_zigzag_chunk_index(q, cu_local, world, rank)
    return dict(chunk_q_list=q_list, chunk_cu_seqlens_q_list=cu_q_list,
                chunk_indices_list=idx_list, kv_buffer=kv_buffer, kv_slices=None,
                nheads=nheads, head_dim=head_dim, softmax_scale=None, dropout_p=0.0,
                causal=True, window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                world_size=world, cu_seqlens_k=cu_local, chunk_idx_0=chunk_idx[0],
                chunk_idx_1=chunk_idx[1])


def dual_inputs():
    torch.manual_seed(2)
    lens_q, lens_k = [5, 11], [20, 33]
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()],
                                   dtype=torch.int32, device=DEVICE)
    q0, q1 = randn(sum(lens_q), 4, 32), randn(sum(lens_q), 4, 32)
    k, v = randn(sum(lens_k), 2, 32), randn(sum(lens_k), 2, 32)
    return q0, q1, k, v, cu(lens_q), cu(lens_q), cu(lens_k), max(lens_q), max(lens_q), max(lens_k)


def assert_same(a, b):
    """Compiled and eager calls run the same kernels on the same inputs: equal results."""
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
        return
    assert not torch.isnan(a).any(), "NaN in the compiled result"
    torch.testing.assert_close(a, b, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------
# opcheck: schema, mutations, fake shapes, AOT dispatch
# ------------------------------------------------------------------------------------------------

def _decode_op_args(split: bool):
    q, k_cache, v_cache, seqlens, table = paged_inputs(q_len=2)
    c = decode.get_paged_decode_config(None, 32) if not HAS_CUDA else \
        decode.get_paged_decode_config(torch.cuda.get_device_capability(), 32)
    fields = (32 ** -0.5, True, c.block_n, c.num_warps, c.num_stages, c.kv_cache_modifier,
              c.kv_eviction, c.max_merged_splits)
    if not split:
        return (q, k_cache, v_cache, seqlens, table, *fields)
    s = 3
    o_part = torch.empty((2, 2, 4, s, 32), dtype=torch.float32, device=DEVICE)
    lse_part = torch.empty((2, 2, 4, s), dtype=torch.float32, device=DEVICE)
    arrivals = torch.zeros((2, 2, 1), dtype=torch.int32, device=DEVICE)  # 2 x 2 rows: 1 M-block
    return (q, k_cache, v_cache, seqlens, table, o_part, lse_part, arrivals, *fields)


def _dual_op_args():
    from kvonce.kernels.configs import op_fields

    q0, q1, k, v, cu0, cu1, cuk, mq0, mq1, _ = dual_inputs()
    ends0 = torch.tensor([7, 30], dtype=torch.int32, device=DEVICE)
    ends1 = torch.tensor([20, 33], dtype=torch.int32, device=DEVICE)
    cfg = kvonce.varlen.get_dual_group_fwd_config(None if not HAS_CUDA else
                                                  torch.cuda.get_device_capability(), 32)
    return (q0, q1, k, v, cu0, cu1, cuk, ends0, ends1, max(mq0, mq1), k.shape[0], 0.2, True,
            *op_fields(cfg))


def _zigzag_op_args():
    from kvonce.kernels.configs import op_fields

    z = zigzag_inputs()
    q0, q1 = z["chunk_q_list"]
    cu0, cu1 = z["chunk_cu_seqlens_q_list"]
    cfg = kvonce.varlen.get_dual_group_fwd_config(None if not HAS_CUDA else
                                                  torch.cuda.get_device_capability(), 32)
    return (q0, q1, z["kv_buffer"], cu0, cu1, z["cu_seqlens_k"], z["chunk_idx_0"],
            z["chunk_idx_1"], z["world_size"], q0.shape[0], 32 ** -0.5, True,
            *op_fields(cfg))


def _merge_op_args():
    o_a, o_b = randn(6, 4, 32), randn(6, 4, 32)
    lse_a = torch.randn(6, 4, device=DEVICE)
    lse_b = torch.randn(6, 4, device=DEVICE)
    lse_b[0] = float("-inf")
    return (o_a, lse_a, o_b, lse_b)


def _append_op_args():
    q, k_cache, v_cache, seqlens, table = paged_inputs()
    return (randn(2, 3, 2, 32), randn(2, 3, 2, 32), k_cache, v_cache, seqlens, table, None, None,
            0, None, None)  # plain cache: no scales, kv_format code 0, no KeyOutliers (quantized:
    # tests/test_append_quant.py; outliers: tests/test_key_outliers.py)


def _prefill_op_args():
    from kvonce.kernels.configs import get_paged_prefill_config, op_fields
    q, k_cache, v_cache, seqlens, table = paged_inputs(q_len=3)
    cu = torch.tensor([0, 3, 4], dtype=torch.int32, device=DEVICE)  # a chunk and a decode row
    c = get_paged_prefill_config(torch.cuda.get_device_capability() if HAS_CUDA else None, 32)
    return (q.flatten(0, 1)[:4], k_cache, v_cache, cu, seqlens, table, 32 ** -0.5, True,
            *op_fields(c))


OP_CASES = {
    "paged_decode": (torch.ops.kvonce.paged_decode, lambda: _decode_op_args(False)),
    "paged_decode_split": (torch.ops.kvonce.paged_decode_split, lambda: _decode_op_args(True)),
    "merge_attention_states": (torch.ops.kvonce.merge_attention_states, _merge_op_args),
    "append_paged_kv": (torch.ops.kvonce.append_paged_kv, _append_op_args),
    "paged_prefill": (torch.ops.kvonce.paged_prefill, _prefill_op_args),
    "dual_group_fwd": (torch.ops.kvonce.dual_group_fwd, _dual_op_args),
    "dual_group_fwd_zigzag": (torch.ops.kvonce.dual_group_fwd_zigzag, _zigzag_op_args),
}


@pytest.mark.parametrize("name", sorted(OP_CASES))
def test_opcheck(name):
    op, make_args = OP_CASES[name]
    torch.library.opcheck(op, make_args())


def test_every_op_is_registered():
    """The ops of the kvonce namespace, each with a fake implementation (opcheck above)."""
    assert set(OP_CASES) <= {name for name in dir(torch.ops.kvonce) if not name.startswith("_")}


def test_append_op_declares_its_mutation():
    """An undeclared mutation is silently dropped by the compiler: the schema must say so."""
    schema = torch.ops.kvonce.append_paged_kv.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    # int8/int4 scales and a KeyOutliers' side cache: written
    assert mutated == {"k_cache", "v_cache", "k_scale", "v_scale", "outlier_values"}
    schema = torch.ops.kvonce.paged_decode_split.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"o_part", "lse_part", "arrivals"}


# ------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) of each public entry point == eager
# ------------------------------------------------------------------------------------------------

def compiled(fn, backend):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_compile_plan_run(backend, num_splits):
    q, k_cache, v_cache, seqlens, table = paged_inputs(q_len=2)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=num_splits)

    def step(q, k_cache, v_cache, seqlens, table):
        return plan.run(q, k_cache, v_cache, seqlens, table, return_lse=True)

    eager = step(q, k_cache, v_cache, seqlens, table)
    assert_same(compiled(step, backend)(q, k_cache, v_cache, seqlens, table), eager)
    ref = paged_attention_sdpa_ref(q, k_cache, v_cache, seqlens, table, causal=True)
    torch.testing.assert_close(eager[0].float(), ref.float(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_paged_attention_and_flash_attn_with_kvcache(backend):
    q, k_cache, v_cache, seqlens, table = paged_inputs()
    k_new, v_new = randn(2, 1, 2, 32), randn(2, 1, 2, 32)

    def step(q, k_cache, v_cache, seqlens, table, k_new, v_new):
        a = kvonce.paged_attention(q, k_cache, v_cache, seqlens, table, num_splits=2)
        b, lse = kvonce.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                                cache_seqlens=seqlens, block_table=table,
                                                causal=True, return_softmax_lse=True)
        return a, b, lse

    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    eager = step(q, *caches[0], seqlens, table, k_new, v_new)
    got = compiled(step, backend)(q, *caches[1], seqlens, table, k_new, v_new)
    assert_same(got, eager)
    # The append inside flash_attn_with_kvcache reached the compiled call's caches too.
    assert_same(caches[1], caches[0])
    assert not torch.equal(caches[1][0], k_cache)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_paged_prefill(backend):
    q, k_cache, v_cache, cu, seqlens, table, *_ = _prefill_op_args()

    def step(q, k_cache, v_cache, cu, seqlens, table):
        return kvonce.paged_prefill(q, k_cache, v_cache, cu, seqlens, table, max_seqlen_q=3,
                                    return_lse=True)

    eager = step(q, k_cache, v_cache, cu, seqlens, table)
    assert_same(compiled(step, backend)(q, k_cache, v_cache, cu, seqlens, table), eager)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_append_and_merge(backend):
    q, k_cache, v_cache, seqlens, table = paged_inputs()
    k_new, v_new = randn(2, 3, 2, 32), randn(2, 3, 2, 32)
    o_a, lse_a, o_b, lse_b = _merge_op_args()

    def step(k_new, v_new, k_cache, v_cache, seqlens, table, o_a, lse_a, o_b, lse_b):
        kvonce.append_paged_kv(k_new, v_new, k_cache, v_cache, seqlens, table)
        return kvonce.merge_attention_states(o_a, lse_a, o_b, lse_b)

    caches = [(k_cache.clone(), v_cache.clone()) for _ in range(2)]
    eager = step(k_new, v_new, *caches[0], seqlens, table, o_a, lse_a, o_b, lse_b)
    got = compiled(step, backend)(k_new, v_new, *caches[1], seqlens, table, o_a, lse_a, o_b,
                                  lse_b)
    assert_same(got, eager)
    assert_same(caches[1], caches[0])
    assert not torch.equal(caches[1][0], k_cache), "the append wrote nothing"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_lens_as_tensor", [False, True])
def test_compile_dual_group_forward(backend, kv_lens_as_tensor):
    args = dual_inputs()
    ends = (torch.tensor([7, 30], dtype=torch.int32, device=DEVICE),
            torch.tensor([20, 33], dtype=torch.int32, device=DEVICE)) if kv_lens_as_tensor \
        else (9, 40)

    def step(*args):
        return kvonce.fused_zigzag_llama3_flash_attn_varlen_forward(*args, *ends)

    assert_same(compiled(step, backend)(*args), step(*args))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_zigzag_replacement(backend):
    z = zigzag_inputs()

    def step(q0, q1, kv_buffer):
        out, lse, _ = replace_execute_grouped_attention_with_fused_varlen(
            **dict(z, chunk_q_list=[q0, q1], kv_buffer=kv_buffer))
        return out, lse

    q0, q1 = z["chunk_q_list"]
    assert_same(compiled(step, backend)(q0, q1, z["kv_buffer"]), step(q0, q1, z["kv_buffer"]))


# ------------------------------------------------------------------------------------------------
# GPU: CUDA graphs through compiled code, the eager launch path's fallbacks
# ------------------------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("num_splits", [1, 4])
def test_plan_run_in_cuda_graph_inside_compiled_function(num_splits):
    q, k_cache, v_cache, seqlens, table = paged_inputs(batch=4, lens=(300, 1000, 17, 640),
                                                       nheads=32, nheads_k=8, head_dim=128)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=num_splits)
    step = compiled(lambda q: plan.run(q, k_cache, v_cache, seqlens, table), "inductor")
    step(q)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(q)
    for _ in range(2):  # new values in the captured input buffers, replayed
        q.copy_(torch.randn_like(q))
        seqlens.copy_(torch.tensor([5, 999, 1, 700], dtype=torch.int32, device=DEVICE))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_attention_sdpa_ref(q, k_cache, v_cache, seqlens, table, causal=True)
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-3, rtol=2e-3)


@gpu_only
def test_eager_launch_rebinds_for_other_layouts_and_misaligned_views():
    """The plan binds its launch to one stride layout and pointer alignment: a q with other
    strides, or a view starting off a 16-byte boundary, must still give the right answer."""
    q, k_cache, v_cache, seqlens, table = paged_inputs(batch=3, lens=(100, 260, 31), nheads=8,
                                                       nheads_k=2, head_dim=128)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table)
    ref = lambda q: paged_attention_sdpa_ref(q, k_cache, v_cache, seqlens, table, causal=True)
    for _ in range(2):  # the second call takes the bound launch
        torch.testing.assert_close(plan.run(q, k_cache, v_cache, seqlens, table).float(),
                                   ref(q).float(), atol=2e-3, rtol=2e-3)
    bound = [key for key in _launch._compiled if key[0] is _paged_decode_kernel]
    assert bound, "the eager path never bound a compiled decode kernel (always Triton's launch)"
    wide = randn(3, 1, 9, 128)[:, :, 1:]        # other strides
    wide.copy_(randn(3, 1, 8, 128))
    for _ in range(2):
        torch.testing.assert_close(plan.run(wide, k_cache, v_cache, seqlens, table).float(),
                                   ref(wide).float(), atol=2e-3, rtol=2e-3)
    flat = randn(q.numel() + 1)[1:].view(q.shape)  # same strides, misaligned pointer
    torch.testing.assert_close(plan.run(flat, k_cache, v_cache, seqlens, table).float(),
                               ref(flat).float(), atol=2e-3, rtol=2e-3)


def test_split_k_arrival_counts_return_to_zero():
    """The one-launch split-K counts arrivals per (sequence, KV head, M-block) and the merging
    program resets them: a second run (a CUDA-graph replay) starts from zero again."""
    q, k_cache, v_cache, seqlens, table = paged_inputs(q_len=2)
    plan = kvonce.PagedDecodePlan(q, k_cache, v_cache, seqlens, table, num_splits=3)
    arrivals = plan._split_scratch[2]
    first = plan.run(q, k_cache, v_cache, seqlens, table)
    assert int(arrivals.count_nonzero()) == 0
    assert_same(plan.run(q, k_cache, v_cache, seqlens, table), first)
