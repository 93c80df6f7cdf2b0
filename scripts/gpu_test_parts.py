"""The GPU test suite in tiers and parts, each part as ``--jobs`` pytest processes sharing the GPU.

    make gpu-test            # --tier fast: every test function, each behaviour value once
    make gpu-test-full       # every case, part after part (each well under 10 minutes)
    make gpu-test-part PART=2

Prints the parts, then one row per part: tests passed/failed/skipped, wall seconds, the slowest
shard's seconds. The shards split a part's selected cases by their measured costs
(tests/_tiers.py, ``KVONCE_TEST_SHARD``); most of the suite's time is Triton compiling kernels and
float64 references on the host, which separate processes overlap (the lent H100 has 16 cores).
``--update-durations`` merges the measured seconds per test into tests/gpu_durations.json, which
the fast tier and the shards read.

Run on a CUDA machine with torch and triton installed, from the repository root:
    python3 scripts/gpu_test_parts.py [--tier fast|full] [--part N ...] [--jobs N]
                                      [--update-durations] [--log-dir DIR [--bundle]]
                                      [--time-limit S] [-- extra pytest arguments]

On the lent device (8 files come back from $OUT, a command stops at 600 s):
    make gpu-test GPU_TEST_ARGS="--log-dir $OUT/tests --bundle --time-limit 560"
stops every shard still running at 560 s (SIGINT: pytest reports what it ran), prints the
failed tests' ids with the table, and leaves the shards' logs as one ``$OUT/tests.tar.gz``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "gpu_durations.json"

# Test modules per part, balanced by the full suite's one-process times on the lent H100
# (docs/benchmarks.md, "GPU test tiers"): each part stays under the device's 10-minute command
# limit even with --jobs 1. Modules in no part join the last one, so none is ever missed.
PARTS: dict[int, list[str]] = {
    1: ["tests/test_dual_group_backward.py"],
    2: ["tests/test_fused_dual_group_flash_attn_varlen.py", "tests/test_ops.py",
        "tests/test_zigzag_cp.py", "tests/test_integrations_hf.py", "tests/test_decode.py"],
    3: ["tests/test_decode_quant.py", "tests/test_append_quant.py", "tests/test_quant.py",
        "tests/test_prefix_decode.py", "tests/test_dispatch_modes.py", "tests/test_launch.py"],
}


def all_parts() -> dict[int, list[str]]:
    parts = {k: list(v) for k, v in PARTS.items()}
    assigned = {m for mods in parts.values() for m in mods}
    parts[max(parts)] += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                                if str(p.relative_to(ROOT)) not in assigned)
    return parts


def run_part(modules: list[str], tier: str, jobs: int, extra: list[str], log_dir: Path | None = None,
             label: str = "", time_limit: float = 0.0):
    """``jobs`` pytest processes, one shard each; returns (rows by test id, wall, slowest shard,
    worst exit code). Exit code 5 (a shard with no tests) counts as success. With ``log_dir``,
    each shard's pytest output and its per-test durations (JSON lines, written as each test ends)
    stay there as ``{label}shard{i}.log`` / ``.jsonl``, so a run cut off by a time limit shows
    which shard was still running and what it had done."""
    logs, procs = [], []
    start = time.perf_counter()
    for index in range(jobs):
        if log_dir is None:
            fd, log = tempfile.mkstemp(suffix=".jsonl")
            os.close(fd)
            stdout = None
        else:
            log = str(log_dir / f"{label}shard{index}.jsonl")
            stdout = open(log_dir / f"{label}shard{index}.log", "w")  # noqa: SIM115 (Popen owns it)
        logs.append(log)
        env = dict(os.environ, KVONCE_DURATIONS_OUT=log, KVONCE_TEST_TIER=tier,
                   PYTHONPATH=str(ROOT / "src"))
        if jobs > 1:
            env["KVONCE_TEST_SHARD"] = f"{index}/{jobs}"
        cmd = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", *extra,
               *modules]
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=stdout,
                                       stderr=subprocess.STDOUT if stdout else None),
                      time.perf_counter()))
    shard_walls, worst = [], 0
    for proc, began in procs:
        rc = _wait(proc, start + time_limit - time.perf_counter() if time_limit else None)
        shard_walls.append(time.perf_counter() - began)
        worst = worst or (0 if rc == 5 else rc)
    wall = time.perf_counter() - start
    rows = {}
    for log in logs:
        lines = Path(log).read_text().splitlines() if Path(log).exists() else []
        rows.update({r["nodeid"]: r for r in map(json.loads, lines)})
        if log_dir is None:
            os.unlink(log)
    return rows, wall, max(shard_walls), worst


def _wait(proc: subprocess.Popen, timeout: float | None) -> int:
    """The shard's exit code; past ``timeout`` seconds it is interrupted (pytest then prints what
    it ran), and killed 20 s later. An interrupted shard counts as failed (exit code 2)."""
    try:
        return proc.wait(timeout=None if timeout is None else max(timeout, 0.0))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"shard pid {proc.pid} stopped at the time limit", flush=True)
        return 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", choices=("fast", "full"), default="full")
    ap.add_argument("--part", type=int, action="append",
                    help="part number (repeatable); default: every part")
    ap.add_argument("--all-in-one", action="store_true",
                    help="every module as one part (the fast tier's default)")
    ap.add_argument("--jobs", type=int, default=4, help="pytest processes per part (default 4)")
    ap.add_argument("--update-durations", action="store_true")
    ap.add_argument("--log-dir", type=Path,
                    help="keep each shard's output and per-test durations here (e.g. $OUT)")
    ap.add_argument("--bundle", action="store_true",
                    help="with --log-dir: leave the logs as one DIR.tar.gz (the device returns 8 "
                         "files)")
    ap.add_argument("--time-limit", type=float, default=0.0,
                    help="seconds a part may run; shards still running then are stopped")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args()
    parts = all_parts()
    if args.all_in_one or (args.tier == "fast" and not args.part):
        parts = {0: [m for mods in parts.values() for m in mods]}
    for k, mods in parts.items():
        print(f"part {k}: {' '.join(mods)}", flush=True)
    chosen = args.part or sorted(parts)
    summary, measured, worst = [], {}, 0
    for k in chosen:
        if k not in parts:
            ap.error(f"--part must be one of {sorted(parts)}, got {k}")
        if args.log_dir:
            args.log_dir.mkdir(parents=True, exist_ok=True)
        rows, wall, slowest, rc = run_part(parts[k], args.tier, args.jobs, args.pytest_args,
                                           args.log_dir, f"part{k}_", args.time_limit)
        for name, row in sorted(rows.items()):
            if row["outcome"] == "failed":
                print(f"FAILED {name}", flush=True)
        measured.update({n: r["seconds"] for n, r in rows.items()})
        count = lambda o: sum(r["outcome"] == o for r in rows.values())  # noqa: E731
        summary.append((k, count("passed"), count("failed"), count("skipped"), wall, slowest, rc))
        worst = worst or rc
    print(f"\ntier {args.tier}, {args.jobs} jobs per part")
    print(f"{'part':>4} {'passed':>7} {'failed':>7} {'skipped':>8} {'wall s':>7} "
          f"{'slowest shard s':>16} {'exit':>5}")
    for k, p, f, s, wall, slowest, rc in summary:
        print(f"{k:>4} {p:>7} {f:>7} {s:>8} {wall:>7.1f} {slowest:>16.1f} {rc:>5}")
    if args.bundle and args.log_dir and args.log_dir.exists():
        bundle = shutil.make_archive(str(args.log_dir), "gztar", args.log_dir.parent,
                                     args.log_dir.name)
        shutil.rmtree(args.log_dir)
        print(f"logs: {bundle}")
    if args.update_durations and measured:
        known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        known.update(measured)
        DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")
        print(f"durations of {len(measured)} tests merged into {DURATIONS.relative_to(ROOT)}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
