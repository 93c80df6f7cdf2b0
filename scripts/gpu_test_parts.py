"""The whole GPU test suite in parts that each finish within 10 minutes on the lent H100
(`make gpu-test-full`, or `make gpu-test-part PART=n` for one part).

Prints the parts, then one row per part run: tests passed/failed/skipped and wall seconds.
``--update-durations`` merges the measured seconds per test into tests/gpu_durations.json, which
the fast tier (`make gpu-test`, tests/_tiers.py) reads to prefer cheap cases.

Run on a CUDA machine with torch and triton installed, from the repository root:
    PYTHONPATH=src python3 scripts/gpu_test_parts.py [--part 1 [--part 2]] [--update-durations]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "gpu_durations.json"

# Test modules per part, balanced by the measured full-suite times (docs/benchmarks.md,
# "GPU test tiers"); each part must stay well under the device's 10-minute command limit.
PARTS: dict[int, list[str]] = {
    1: ["tests/test_dual_group_backward.py"],
    2: ["tests/test_fused_dual_group_flash_attn_varlen.py", "tests/test_ops.py",
        "tests/test_zigzag_cp.py", "tests/test_integrations_hf.py"],
    3: ["tests/test_decode.py", "tests/test_decode_quant.py", "tests/test_append_quant.py",
        "tests/test_quant.py", "tests/test_prefix_decode.py"],
}


def unassigned() -> list[str]:
    """Test modules in no part (the newest ones go to the last part, so none is ever missed)."""
    assigned = {m for mods in PARTS.values() for m in mods}
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if str(p.relative_to(ROOT)) not in assigned)


def run_part(modules: list[str], extra: list[str]) -> tuple[dict, float, int]:
    fd, log = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    env = dict(os.environ, KVONCE_DURATIONS_OUT=log, PYTHONPATH=str(ROOT / "src"))
    start = time.perf_counter()
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-ra", *extra, *modules],
                         cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in Path(log).read_text().splitlines()]
    os.unlink(log)
    return {r["nodeid"]: r for r in rows}, wall, rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", type=int, action="append", help="part number (repeatable)")
    ap.add_argument("--update-durations", action="store_true")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()
    parts = {k: list(v) for k, v in PARTS.items()}
    parts[max(parts)] += unassigned()
    for k, mods in parts.items():
        print(f"part {k}: {' '.join(mods)}")
    chosen = args.part or sorted(parts)
    summary, measured, worst = [], {}, 0
    for k in chosen:
        if k not in parts:
            ap.error(f"--part must be one of {sorted(parts)}, got {k}")
        rows, wall, rc = run_part(parts[k], args.pytest_args)
        measured.update({n: r["seconds"] for n, r in rows.items()})
        count = lambda o: sum(r["outcome"] == o for r in rows.values())  # noqa: E731
        summary.append((k, count("passed"), count("failed"), count("skipped"), wall, rc))
        worst = worst or rc
    print(f"\n{'part':>4} {'passed':>7} {'failed':>7} {'skipped':>8} {'seconds':>8} {'exit':>5}")
    for k, p, f, s, wall, rc in summary:
        print(f"{k:>4} {p:>7} {f:>7} {s:>8} {wall:>8.1f} {rc:>5}")
    if args.update_durations and measured:
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update(measured)
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")
        print(f"durations of {len(measured)} tests merged into {DURATIONS.relative_to(ROOT)}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
