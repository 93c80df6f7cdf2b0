"""`python -m kvonce bench serve` end to end at its CPU smoke size: a tiny fp32 Llama through
transformers' generate_batch with paged|sdpa and paged|kvonce (the kvonce kernels under the
Triton interpreter), rows written as JSON, and kvonce's greedy tokens equal to sdpa's."""
import inspect
import json

import pytest
import torch

from kvonce.bench import serve


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke size; the GPU runs the bench")
def test_serve_bench_cpu_smoke(hf_continuous_batching, tmp_path):
    """Rows for sdpa and kvonce (in place), and where transformers' layers gather K/V before the
    attention function (>= 5.24), kvonce-gathered (the fallback) too: tokens equal sdpa's."""
    from transformers.models.llama.modeling_llama import LlamaAttention

    gathers = "cache" in inspect.signature(LlamaAttention.forward).parameters
    out = tmp_path / "serve.json"
    serve.main(["--device", "cpu", "--quick", "--no-progress", "--json", str(out)]
               + (["--gathered"] if gathers else []))
    rows = json.loads(out.read_text())
    assert [r["backend"] for r in rows] == ["sdpa", "kvonce"] + (["kvonce-gathered"] if gathers
                                                                 else [])
    assert [r["path"] for r in rows] == ["-", "in-place"] + (["gathered"] if gathers else [])
    assert all(r["tokens"] > 0 and r["tok_s"] > 0 for r in rows)
    assert all(r["same"] == 1.0 and r["prefix"] == 1.0 for r in rows[1:])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke size; the GPU runs the bench")
def test_serve_bench_exits_nonzero_when_requests_fail(hf_continuous_batching, monkeypatch,
                                                      tmp_path):
    """A backend whose every attention call raises: transformers marks its requests failed and
    returns them; the bench exits with the error instead of a row of 0 tokens and nan."""
    from kvonce.integrations import hf_paged

    def broken(*args, **kwargs):
        raise RuntimeError("kernel broken on purpose")

    monkeypatch.setattr(hf_paged, "paged_prefill", broken)
    monkeypatch.setattr(hf_paged, "flash_attn_varlen_func", broken)
    monkeypatch.setattr(serve, "IMPLS", ("paged|kvonce",))
    out = tmp_path / "serve.json"
    with pytest.raises(SystemExit, match=r"paged\|kvonce: 4/4 outputs, 4 failed.*kernel broken"):
        serve.main(["--device", "cpu", "--no-progress", "--json", str(out)])
    assert not out.exists()


def test_serve_bench_needs_a_gpu_or_cpu_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA GPU"):
        serve.main(["--quick"])
