"""``make kernel-check``: compile every Gluon kernel of kvonce for sm_90a on the CPU and inspect it.

No GPU is needed: ``triton.compile`` with a ``GPUTarget("cuda", 90, 32)``, then the triton wheel's
own ``ptxas -v --gpu-name sm_90a`` and ``cuobjdump -sass``. A kernel module joins the check by
exporting ``GLUON_CHECK_SPECS``: a list of ``(variant, kernel, signature, constexprs, options)``
tuples (the arguments of ``GluonASTSource`` and ``triton.compile``), optionally followed by a dict
of expected SASS counts (``{"HGMMA": 32}``): a schedule that changes shape then fails the check.

One row per kernel variant: registers, spill bytes (stores + loads), shared memory bytes (the
launch's dynamic shared memory, ``metadata.shared``), and SASS counts that show the schedule's
shape: HGMMA, UTMAREDG (TMA reduce-add), USETMAXREG (setmaxnreg), WARPGROUP.DEPBAR and
WARPGROUP.ARRIVE. Exits non-zero on a compile error, any spill, any ptxas wgmma serialization
warning (C7510/C7512/C7514 or any "wgmma ... serialized" text), any spill instruction inside a
steady-state wgmma loop (``wgmma_loop_spills``; a spill elsewhere is shown in the table and its
status), or shared memory over the H100's 232448 bytes per block.

    .venv/bin/python scripts/kernel_check.py [--only SUBSTRING] [--keep DIR] [--jobs N]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMEM_LIMIT = 232448  # H100: 227 KB of dynamic shared memory per block
SASS_COUNTS = ("HGMMA", "UTMAREDG", "USETMAXREG", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE")
_WGMMA_WARNING = re.compile(r"C751[024]|wgmma[^\n]*serializ", re.IGNORECASE)
_REGS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


@dataclass
class Row:
    name: str
    registers: int = 0
    spill_bytes: int = 0
    shared: int = 0
    counts: dict = field(default_factory=dict)
    seconds: float = 0.0
    problems: list = field(default_factory=list)


def parse_ptxas(text: str) -> dict:
    """``ptxas -v`` output -> registers (max over functions), spill bytes (stores + loads,
    summed) and the wgmma serialization warnings, one line each."""
    regs = [int(m) for m in _REGS.findall(text)]
    spills = sum(int(s) + int(l) for s, l in _SPILLS.findall(text))
    warnings = [line.strip() for line in text.splitlines() if _WGMMA_WARNING.search(line)]
    return {"registers": max(regs, default=0), "spill_bytes": spills, "wgmma_warnings": warnings}


def count_sass(sass: str) -> dict:
    """Instruction counts in ``cuobjdump -sass`` text (``HGMMA.64x128x16.F32.BF16`` counts as
    HGMMA; ``WARPGROUP.DEPBAR.LE`` as WARPGROUP.DEPBAR)."""
    counts = {}
    for op in SASS_COUNTS:
        counts[op] = len(re.findall(r"\b" + re.escape(op) + r"\b", sass))
    return counts


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_BRANCH_TARGET = re.compile(r"\bBRA\b.*0x([0-9a-f]+)\s*$")


def wgmma_loop_spills(sass: str) -> list[str]:
    """The spill instructions (STL/LDL) inside the steady-state wgmma loops of ``cuobjdump
    -sass`` text: a loop is the address range of a backward branch ``[target, branch]``; a
    wgmma loop holds an HGMMA; the steady-state ones hold no other wgmma loop. A spill there
    runs every step; one in an outer loop (once per q head) or the prologue/epilogue runs once
    per CTA or segment and is reported, not failed (``problems_of``). Branches past the last
    EXIT are ptxas's out-of-line slow paths (an mbarrier wait's retry, jumping back to where
    it was called): not loop edges, or a warp-specialized kernel's loader wait would look
    like a loop over the other partitions' code."""
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in _SASS_LINE.finditer(sass)]
    exits = [addr for addr, op in code if re.match(r"(@!?U?P\w+\s+)?EXIT\b", op)]
    body_end = max(exits) if exits else float("inf")
    loops = []
    for addr, op in code:
        m = _BRANCH_TARGET.search(op)
        if m and int(m.group(1), 16) < addr < body_end:
            lo, hi = int(m.group(1), 16), addr
            if any(lo <= a <= hi and op2.startswith("HGMMA") for a, op2 in code):
                loops.append((lo, hi))
    inner = [(lo, hi) for lo, hi in loops
             if not any((lo, hi) != o and lo <= o[0] and o[1] <= hi for o in loops)]
    return [f"{a:#06x} {op}" for a, op in code
            if re.match(r"(@!?U?P\w+\s+)?(STL|LDL)\b", op)
            and any(lo <= a <= hi for lo, hi in inner)]


def problems_of(report: dict, shared: int, sass: str | None = None) -> list[str]:
    """What fails a variant. Spills fail outright without ``sass``; with it, only spills inside
    a steady-state wgmma loop do (``wgmma_loop_spills``): ptxas at 240 registers may park one
    loop-invariant value per q head in local memory, which costs nothing measurable, while a
    spill in the step loop is the pressure the check exists to catch."""
    problems = []
    if report["spill_bytes"]:
        if sass is None:
            problems.append(f"{report['spill_bytes']} bytes spilled")
        else:
            hot = wgmma_loop_spills(sass)
            if hot:
                problems.append(f"{report['spill_bytes']} bytes spilled, in the wgmma loop: "
                                + "; ".join(hot[:4]))
    problems += [f"ptxas: {w}" for w in report["wgmma_warnings"]]
    if shared > SMEM_LIMIT:
        problems.append(f"shared memory {shared} > {SMEM_LIMIT}")
    return problems


def _error_chain(exc: BaseException) -> str:
    """The innermost causes first: triton wraps the real error (a NameError, a layout mismatch)
    in one CompilationError per call level, each showing only source context."""
    chain = []
    while exc is not None:
        chain.append(f"{type(exc).__name__}: {str(exc).strip()[-1500:]}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(reversed(chain))[:4000]


def _tool(name: str) -> str:
    """The ``ptxas`` / ``cuobjdump`` Triton itself uses (``triton.knobs.nvidia``: the wheel's own,
    or ``TRITON_PTXAS_PATH`` & co. where an image points Triton at a newer CUDA): the PTX Triton
    emits targets that ptxas's version, so an older one beside it would reject it."""
    from triton import knobs

    tool = getattr(knobs.nvidia, name)
    if tool is None or not Path(tool.path).exists():
        raise FileNotFoundError(f"{name} not found (triton.knobs.nvidia.{name})")
    return str(tool.path)


def discover_specs(package: str = "kvonce.kernels") -> list[tuple]:
    """``(module, variant, kernel, signature, constexprs, options, expected_counts)`` for every
    entry of every ``GLUON_CHECK_SPECS`` under ``package``. Only modules whose source names the
    registry are imported."""
    pkg = importlib.import_module(package)
    specs = []
    for path in sorted(Path(pkg.__file__).parent.glob("*.py")):
        if "GLUON_CHECK_SPECS" not in path.read_text():
            continue
        module = importlib.import_module(f"{package}.{path.stem}")
        for spec in getattr(module, "GLUON_CHECK_SPECS", ()):
            expected = spec[5] if len(spec) > 5 else {}
            specs.append((path.stem, *spec[:5], expected))
    return specs


def ptxas_and_sass(compiled, stem: str, keep: Path | None = None):
    """``(ptxas -v process, SASS text)`` of a kernel compiled for sm_90a; with ``keep``, its PTX,
    TTGIR, cubin and SASS stay there under ``stem``."""
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ptx, cubin = work / f"{stem}.ptx", work / f"{stem}.cubin"
        ptx.write_text(compiled.asm["ptx"])
        cubin.write_bytes(compiled.asm["cubin"])
        if keep:
            (work / f"{stem}.ttgir").write_text(compiled.asm["ttgir"])
        proc = subprocess.run([_tool("ptxas"), "-v", "--gpu-name", "sm_90a", str(ptx), "-o",
                               str(work / f"{stem}.ptxas.cubin")],
                              capture_output=True, text=True)
        sass = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
        if keep:
            (work / f"{stem}.sass").write_text(sass)
    return proc, sass


def check_spec(module: str, variant: str, kernel, signature: dict, constexprs: dict,
               options: dict, expected: dict | None = None, keep: Path | None = None) -> Row:
    """Compile one variant for sm_90a and inspect it (never raises: errors become problems)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    row = Row(f"{module}.{kernel.__name__}[{variant}]")
    start = time.perf_counter()
    try:
        compiled = triton.compile(GluonASTSource(kernel, signature, constexprs),
                                  target=GPUTarget("cuda", 90, 32), options=dict(options))
    except Exception as exc:  # a compile error is a result of the check, not a crash of it
        row.problems.append("compile error: " + _error_chain(exc))
        row.seconds = time.perf_counter() - start
        return row
    row.shared = compiled.metadata.shared
    proc, sass = ptxas_and_sass(compiled, f"{module}.{kernel.__name__}.{variant}", keep)
    if proc.returncode:
        row.problems.append(f"ptxas failed: {proc.stderr[-2000:]}")
    report = parse_ptxas(proc.stdout + proc.stderr)
    row.registers, row.spill_bytes = report["registers"], report["spill_bytes"]
    row.counts = count_sass(sass)
    row.problems += problems_of(report, row.shared, sass)
    for op, n in (expected or {}).items():
        if row.counts.get(op) != n:
            row.problems.append(f"{op}: {row.counts.get(op)} in SASS, expected {n}")
    row.seconds = time.perf_counter() - start
    return row


def format_table(rows: list[Row]) -> str:
    head = ["kernel", "regs", "spill B", "smem B", *SASS_COUNTS, "s", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.name, r.registers, r.spill_bytes, r.shared,
                 *(r.counts.get(op, "-") for op in SASS_COUNTS), f"{r.seconds:.1f}",
                 "FAIL" if r.problems else "ok" if not r.spill_bytes else
                 "ok (spill outside the wgmma loop)"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


_WORKER_SPECS: list | None = None


def _check_index(index: int, keep: Path | None) -> Row:
    """A worker process's check of ``discover_specs()[index]`` (kernels do not pickle: each
    worker discovers the specs once and compiles the ones it is handed)."""
    global _WORKER_SPECS
    if _WORKER_SPECS is None:
        sys.path.insert(0, str(ROOT / "src"))
        _WORKER_SPECS = discover_specs()
    return check_spec(*_WORKER_SPECS[index], keep=keep)


def run_check(only: str | None = None, keep: Path | None = None, jobs: int = 1) -> list[Row]:
    """Every matching variant's row, in ``discover_specs`` order; ``jobs`` > 1 compiles them in
    that many processes (each compile is single-threaded: ptxas and Triton's passes)."""
    specs = discover_specs()
    picked = [i for i, (module, variant, kernel, *_) in enumerate(specs)
              if not only or only in f"{module}.{kernel.__name__}[{variant}]"]
    if jobs <= 1 or len(picked) <= 1:
        return [check_spec(*specs[i], keep=keep) for i in picked]
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(
            max_workers=min(jobs, len(picked)),
            mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_check_index, picked, [keep] * len(picked)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="check only variants whose name contains this")
    parser.add_argument("--keep", type=Path, help="write ptx/ttgir/sass/cubin files here")
    parser.add_argument("--json", type=Path, help="also write the rows here (a list of dicts)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="compile processes (default: the CPUs this process may use)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    os.environ.pop("TRITON_INTERPRET", None)  # Gluon never runs in the interpreter
    rows = run_check(args.only, args.keep, args.jobs)
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows]))
    print(format_table(rows))
    failed = [r for r in rows if r.problems]
    for r in failed:
        for p in r.problems:
            print(f"FAIL {r.name}: {p}")
    if not rows:
        print("FAIL: no Gluon kernel found (GLUON_CHECK_SPECS)")
        return 1
    print(f"kernel-check: {len(rows) - len(failed)}/{len(rows)} variants ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
