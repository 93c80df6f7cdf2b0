"""fp32 relative error against float64 per kernel family, under PyTorch's default matmul
precision ("highest": IEEE fp32 dots since issue 24) and with TF32 allowed ("high": the same
dots Triton ran by default before, i.e. kvonce's old fp32 behaviour). PyTorch's SDPA (math or
its default backend) on the same data is printed beside as the peer.

    PYTHONPATH=src python scripts/fp32_errors.py        (a GPU; the families of
                                                          tests/test_fp32_precision.py)
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import test_fp32_precision as T  # noqa: E402


def sdpa_error() -> float:
    """PyTorch SDPA in fp32 (its default backend choice) against float64, causal, GQA 8/2."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(shape, generator=g).cuda() for shape in
               ((1, 8, 300, 128), (1, 2, 300, 128), (1, 2, 300, 128)))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                         enable_gqa=True)
    return T.rel_err(out, ref)


def main() -> None:
    rows = []
    for family in T.FAMILIES:
        errs = {}
        for precision in ("highest", "high"):
            with T.matmul_precision(precision):
                errs[precision] = {name: T.rel_err(out, ref) for name, out, ref in family(seed=11)}
        for name in errs["highest"]:
            rows.append((family.__name__, name, errs["high"][name], errs["highest"][name]))
    for precision in ("highest", "high"):
        with T.matmul_precision(precision):
            rows.append((f"torch SDPA ({precision})", "out", float("nan"), sdpa_error()))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'family':28s} {'output':6s} {'TF32 (old default)':>18s} {'IEEE (new default)':>18s}")
    for fam, name, tf32, ieee in rows:
        print(f"{fam:28s} {name:6s} {tf32:18.2e} {ieee:18.2e}")


if __name__ == "__main__":
    main()
