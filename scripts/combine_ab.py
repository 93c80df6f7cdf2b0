"""The split-K combine's launch shape, before (one program a head, 32 splits a round) and after
(``paged_decode.combine_launch_shape``: 32-channel chunks, up to 128 splits a round), on the
decode rows that run a combine kernel. CUDA-graph medians, d128, page 16, random page order.

    PYTHONPATH=src python scripts/combine_ab.py
"""
import kvonce
from decode_ncu_case import paged_case
from kvonce.kernels import paged_decode
from kvonce.kernels._launch import next_pow2
from quant_decode_sweep import graph_us

ROWS = [(12, 2, 8, 8192, "plain"), (12, 2, 2, 32768, "plain"), (12, 2, 1, 65536, "plain"),
        (12, 2, 1, 131072, "plain"), (32, 8, 4, 16384, "plain"), (32, 8, 1, 131072, "plain"),
        (12, 12, 1, 65536, "plain"), (12, 12, 1, 131072, "plain"),
        (32, 8, 1, 131072, "fp8_e4m3"), (32, 8, 1, 131072, "int8"),
        (12, 12, 1, 131072, "fp8_e4m3"), (12, 12, 1, 131072, "int8")]


def old_shape(nheads, q_len, batch, num_splits, block_d):
    return ((nheads, q_len, batch), dict(BLOCK_S=min(32, next_pow2(num_splits)), BLOCK_D=block_d,
                                         D_SPLITS=1), (4 if block_d <= 128 else 8, 3))


def main() -> None:
    new_shape = paged_decode.combine_launch_shape
    print("| heads | batch x len | cache | splits | before us | after us | before/after |")
    print("|---|---|---|---|---|---|---|")
    for hq, hk, batch, length, fmt in ROWS:
        q, k, v, table, seqlens, kw = paged_case(hq, hk, batch, length, fmt)
        times, outs = [], []
        for shape in (old_shape, new_shape):
            paged_decode.combine_launch_shape = shape
            plan = kvonce.PagedDecodePlan(q, k, v, seqlens, table, **kw)
            run = lambda: plan.run(q, k, v, seqlens, table, return_lse=True, **kw)
            outs.append(run())
            times.append(graph_us(run))
        paged_decode.combine_launch_shape = new_shape
        (o0, l0), (o1, l1) = outs
        assert (o0.float() - o1.float()).abs().max() < 1e-2 and (l0 - l1).abs().max() < 1e-4
        splits = plan._launches and next(iter(plan._launches.values())).num_splits
        print(f"| {hq}/{hk} | {batch} x {length} | {fmt} | {splits} | {times[0]:.1f} | "
              f"{times[1]:.1f} | {times[0] / times[1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
