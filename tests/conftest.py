"""Device selection: CUDA when present (real sizes, fp16 + bf16), else the Triton interpreter on
CPU (small sizes, fp16 + fp32: the interpreter's bf16 tl.dot is wrong in triton 3.6)."""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before any @triton.jit function is created (i.e. before kvonce is imported).
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"
DTYPES = (torch.float16, torch.bfloat16) if HAS_CUDA else (torch.float16, torch.float32)


@pytest.fixture
def poison_empty(monkeypatch):
    """While active, torch.empty / empty_like return NaN-filled floating tensors, so any output
    element a kernel forgets to write fails the comparison."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def _poison(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: _poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: _poison(real_empty_like(*a, **k)))
    yield
