"""CPU model of where the Gluon backward's time goes on the bench's Llama-3-8B CP cases (world 8,
32/8 heads, d128, causal; ``kernels/gluon_bwd.py``): CTAs, q steps per CTA (64 rows x 128 keys,
each q head of the KV head, both zigzag groups), the tile fill, and the ms per SM-step the
H100 measured (2026-11-25, ``scripts/gluon_bwd_gpu_check.py``). No GPU, no torch.

    python scripts/gluon_bwd_model.py
"""
from __future__ import annotations

import math

BLOCK_M, BLOCK_N, SMS = 64, 128, 132
MEASURED_MS = {("1x8192", 0): 23.33, ("1x8192", 3): 22.85, ("1x8192", 7): 21.16,
               ("mixed", 3): 6.29}
LENS = {"1x8192": (8192,), "mixed": (2048, 1536, 1024, 1024, 768, 768, 512, 512)}


def cta_steps(c: int, world: int, rank: int, blk: int, kv_group: int = 4):
    """(steps, useful (query, key) pairs) of the CTA at key block ``blk`` of a sequence with
    zigzag chunk ``c``: group 0 sees ``(rank + 1) c`` keys, group 1 ``(2 world - rank) c``."""
    n0, steps, useful = blk * BLOCK_N, 0, 0
    for end in ((rank + 1) * c, (2 * world - rank) * c):
        diag = end - c
        lo = (max(n0 - diag, 0) // BLOCK_M) * BLOCK_M
        for m0 in range(lo, c if n0 < end else 0, BLOCK_M):
            steps += 1
            for i in range(m0, min(m0 + BLOCK_M, c)):
                useful += max(0, min(i + diag, end - 1, n0 + BLOCK_N - 1) - n0 + 1)
    return steps * kv_group, useful * kv_group


def main() -> None:
    world, heads_k = 8, 8
    print("| case | grid CTAs | with steps | zero-step | exit at once | steps | tile fill | "
          "max / mean steps per CTA | measured ms | us per SM-step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, rank), ms in MEASURED_MS.items():
        cs = [n // 2 for n in LENS[name]]
        n_blocks = math.ceil(max(cs) * 2 * world / BLOCK_N)
        work, zero, gone, steps, useful = [], 0, 0, 0, 0
        for c in cs:
            for blk in range(n_blocks):
                if blk * BLOCK_N >= 16 * c:
                    gone += heads_k
                    continue
                s, u = cta_steps(c, world, rank, blk)
                steps, useful = steps + s * heads_k, useful + u * heads_k
                if s:
                    work += [s] * heads_k
                else:
                    zero += heads_k
        print(f"| {name} r{rank} | {len(cs) * n_blocks * heads_k} | {len(work)} | {zero} | "
              f"{gone} | {steps} | {useful / (steps * BLOCK_M * BLOCK_N):.1%} | "
              f"{max(work)} / {sum(work) / len(work):.0f} | {ms} | "
              f"{ms * 1e3 * SMS / steps:.2f} |")


if __name__ == "__main__":
    main()
