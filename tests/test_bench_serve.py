"""`python -m kvonce bench serve` end to end at its CPU smoke size: a tiny fp32 Llama through
transformers' generate_batch with paged|sdpa and paged|kvonce (the kvonce kernels under the
Triton interpreter), rows written as JSON, and kvonce's greedy tokens equal to sdpa's."""
import json

import pytest
import torch

from kvonce.bench import serve


def _has_continuous_batching():
    try:
        from transformers import ContinuousBatchingConfig  # noqa: F401
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke size; the GPU runs the bench")
@pytest.mark.skipif(not _has_continuous_batching(),
                    reason="transformers without continuous batching, or psutil missing")
def test_serve_bench_cpu_smoke(tmp_path):
    out = tmp_path / "serve.json"
    serve.main(["--device", "cpu", "--quick", "--no-progress", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["backend"] for r in rows] == ["sdpa", "kvonce"]
    assert all(r["tokens"] > 0 and r["tok_s"] > 0 for r in rows)
    assert rows[1]["same"] == 1.0 and rows[1]["prefix"] == 1.0


def test_serve_bench_needs_a_gpu_or_cpu_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="CUDA GPU"):
        serve.main(["--quick"])
