"""Tables, markdown rows and plots shared by the benchmarks (tabulate/matplotlib imported lazily)."""
from __future__ import annotations

import os


def time_ms(fn) -> float:
    """``triton.testing.do_bench`` median of ``fn`` in ms (25 ms warm-up, 200 ms of repeats)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def paired_ratio(fn_a, fn_b, rounds: int = 7) -> float:
    """Median over ``rounds`` of ``time(fn_b) / time(fn_a)``, the two timed back to back in each
    round (``do_bench`` medians, 50 ms of repeats each). Clock and thermal drift within one run
    moves a single kernel's median by as much as a few-percent gap between two kernels; paired
    rounds cancel most of it, so ratios near 1 (the CP path against the contiguous one) are
    read from this and not from two separately timed medians."""
    import statistics

    import triton.testing

    bench = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")  # noqa: E731
    ratios = []
    for i in range(rounds):
        # alternate which runs first, so a step in clocks between the two does not bias one side
        if i % 2:
            b = bench(fn_b)
            a = bench(fn_a)
        else:
            a = bench(fn_a)
            b = bench(fn_b)
        ratios.append(b / a)
    return statistics.median(ratios)


def worst_rel_err(got, base) -> float:
    """The largest ``||a - b|| / ||b||`` over paired tensors (NaN entries counted as 0, so a NaN
    shows as a large error rather than hiding the others): how far a config's outputs are from
    the first config's in the sweeps."""
    return max(((a - b).nan_to_num(0).norm() / b.nan_to_num(0).norm()).item()
               for a, b in zip(got, base))


def _fmt(x):
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def format_rows(rows: list[dict], fmt: str = "simple") -> str:
    """A table of ``rows`` (dicts with the same keys); tabulate when installed."""
    if not rows:
        return "(no rows)"
    headers = list(rows[0].keys())
    body = [[_fmt(r[h]) for h in headers] for r in rows]
    try:
        from tabulate import tabulate
    except ImportError:
        lines = [" | ".join(headers)] + [" | ".join(r) for r in body]
        return "\n".join(lines)
    return tabulate(body, headers=headers, tablefmt=fmt)


def environment() -> str:
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return f"GPU {gpu}, torch {torch.__version__}, triton {triton.__version__}"


def append_markdown(path: str, title: str, rows: list[dict], *, command: str, dtype: str,
                    date: str) -> None:
    """Append a dated section with the environment, the command and the table to ``path``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as f:
        f.write(f"\n### {title}, {dtype}, {date}\n\n{environment()}.\n"
                f"Command: `PYTHONPATH=src {command}`\n\n")
        f.write(format_rows(rows, fmt="github") + "\n")


def bar_plot(path: str, rows: list[dict], label_key: str, value_keys: list[str], ylabel: str) -> None:
    """Grouped bar chart of ``value_keys`` per row; skipped (with a message) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot written")
        return
    labels = [str(r[label_key]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows)), 4.5))
    width = 0.8 / len(value_keys)
    for i, key in enumerate(value_keys):
        ax.bar([x + i * width for x in range(len(rows))], [r[key] for r in rows], width, label=key)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], labels, rotation=60, ha="right",
                  fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")
