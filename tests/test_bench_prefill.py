"""bench/prefill.py's argument parsing and input layouts (the GPU timing itself is not tested).

The peers' layouts are checked where they can be without the peers: the contiguous K/V given to
FA2 must reproduce the paged attention (kvonce.paged_prefill against the float32 varlen
reference on it), and FlashInfer's page metadata must name each sequence's pages and length.
"""
from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, HAS_CUDA

import kvonce
from kvonce.bench import prefill as bench
from kvonce.kernels.configs import interpreter_active
from kvonce.reference import varlen_attention_ref

needs_kernels = pytest.mark.skipif(not HAS_CUDA and not interpreter_active(),
                                   reason="needs a CUDA GPU or TRITON_INTERPRET=1")
# A decode row, a prompt with no history, a chunk over a history; lengths off the page size.
SMALL = bench.Case("small", ((2, 1, 37), (1, 20, 20), (1, 5, 50)))


def test_help_works_without_a_gpu(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    assert "--rows" in capsys.readouterr().out


def test_unknown_row_is_an_argument_error():
    with pytest.raises(SystemExit) as exc:
        bench.main(["--rows", "prefill,nope"])
    assert exc.value.code == 2


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given on a machine without CUDA")
def test_needs_cuda():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.main(["--quick", "--md", "", "--plot", ""])


def test_flops_count_visible_pairs():
    assert bench.CASES["prefill"].flops() == 4 * 128 * 32 * 8 * (2048 * 2049 // 2)
    # A chunk of 512 rows over 8192 keys: row i sees 7681 + i keys.
    assert bench.CASES["chunked"].flops() == 4 * 128 * 32 * 64 * (512 * 7681 + 511 * 512 // 2)
    assert bench.CASES["decode"].kv_bytes() == 2 * 64 * 8192 * 8 * 128 * 2


@needs_kernels
@pytest.mark.parametrize("page_size", [16, 32])
def test_dense_kv_matches_the_paged_cache(page_size):
    inp = bench.make_inputs(SMALL, page_size, dtype=torch.float16, device=DEVICE, nheads=4,
                            nheads_k=2, head_dim=32)
    assert inp.block_table.shape == (4, -(-50 // page_size))
    out = kvonce.paged_prefill(*inp[:6], max_seqlen_q=20, check_block_table=True)
    k, v, cu_k = bench.dense_kv(inp)
    assert cu_k.tolist() == [0, 37, 74, 94, 144]
    ref, _ = varlen_attention_ref(inp.q, k, v, inp.cu_seqlens_q, cu_k, causal=True)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 3e-3, f"relative error {err:.1e}"


@pytest.mark.parametrize("page_size", [16, 32])
def test_flashinfer_page_metadata(page_size):
    inp = bench.make_inputs(SMALL, page_size, dtype=torch.float16, device=DEVICE, nheads=4,
                            nheads_k=2, head_dim=32)
    indptr, indices, last = bench.flashinfer_pages(inp)
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert sorted(indices.tolist()) == list(range(inp.k_cache.shape[0]))  # each page once
    for b, k_len in enumerate(SMALL.k_lens):
        lo, hi = int(indptr[b]), int(indptr[b + 1])
        assert (hi - lo - 1) * page_size + int(last[b]) == k_len
        assert 1 <= int(last[b]) <= page_size
        assert indices[lo:hi].tolist() == inp.block_table[b, :hi - lo].tolist()
