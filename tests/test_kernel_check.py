"""`make kernel-check` in CI: every Gluon kernel compiles for sm_90a on the CPU (triton.compile,
the wheel's ptxas and cuobjdump) with no spill in its wgmma loop, no wgmma serialization and
shared memory within the H100's limit; and the parser really flags what it must (canned ptxas
output and SASS)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("kernel_check", ROOT / "scripts" / "kernel_check.py")
kernel_check = importlib.util.module_from_spec(spec)
sys.modules["kernel_check"] = kernel_check  # dataclasses look their module up there
spec.loader.exec_module(kernel_check)

CANNED_PTXAS = """\
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage in the function 'k'
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    0 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 168 registers, used 3 barriers
"""


def test_parser_flags_spills_and_serialization():
    report = kernel_check.parse_ptxas(CANNED_PTXAS)
    assert report["registers"] == 168
    assert report["spill_bytes"] == 40
    assert len(report["wgmma_warnings"]) == 1 and "C7514" in report["wgmma_warnings"][0]
    problems = kernel_check.problems_of(report, shared=240000)
    assert len(problems) == 3, problems  # spill, C7514, shared memory over 232448
    clean_text = "".join(CANNED_PTXAS.splitlines(True)[1:]).replace(
        "24 bytes spill stores, 16", "0 bytes spill stores, 0")
    clean = kernel_check.parse_ptxas(clean_text)
    assert kernel_check.problems_of(clean, shared=1000) == []


def _sass(lines):
    return "".join(f"        /*{a:04x}*/                   {op} ;\n" for a, op in lines)


def test_spills_fail_only_in_the_wgmma_loop():
    # An outer loop (0x0100-0x0400) around the step loop (0x0200-0x0300, with the HGMMA); a
    # loop without HGMMA (0x0500-0x0540): a spill counts only inside the step loop.
    outside = [(0x0100, "STL [R1], R0"), (0x0200, "HGMMA.64x64x16.F32.BF16 R24"),
               (0x0300, "@P0 BRA 0x200"), (0x0310, "LDL R7, [R1]"), (0x0400, "@!P1 BRA 0x100"),
               (0x0500, "LDL R3, [R1+0x4]"), (0x0540, "BRA 0x500")]
    assert kernel_check.wgmma_loop_spills(_sass(outside)) == []
    inside = outside[:2] + [(0x0250, "LDL.LU R9, [R1]")] + outside[2:]
    assert kernel_check.wgmma_loop_spills(_sass(inside)) == ["0x0250 LDL.LU R9, [R1]"]
    report = kernel_check.parse_ptxas(CANNED_PTXAS.splitlines(True)[1] + "".join(
        CANNED_PTXAS.splitlines(True)[2:]))
    assert report["spill_bytes"] == 40 and not report["wgmma_warnings"]
    assert kernel_check.problems_of(report, shared=1000, sass=_sass(outside)) == []
    assert len(kernel_check.problems_of(report, shared=1000, sass=_sass(inside))) == 1
    assert len(kernel_check.problems_of(report, shared=1000)) == 1   # no SASS: any spill fails


def test_slow_paths_past_the_exit_are_not_loops():
    # A loader's wait (0x0600) retries out of line past the EXIT (0x0900-0x0920) and jumps back
    # into the loader's loop (0x0580-0x0700): the jump back spans the consumer's step loop
    # (0x0200-0x0300), but it is no loop edge, so the stub's reload of a spilled value is not in
    # a wgmma loop.
    code = [(0x0200, "HGMMA.64x64x16.F32.BF16 R24"), (0x0300, "@P0 BRA 0x200"),
            (0x0580, "LDG.E R2, desc[UR52][R4.64]"), (0x0600, "@!P1 BRA 0x900"),
            (0x0610, "LDL R0, [R1]"), (0x0700, "@P2 BRA 0x580"), (0x0800, "EXIT"),
            (0x0900, "LDL R3, [R1]"), (0x0910, "@!P1 BRA 0x900"), (0x0920, "BRA 0x600")]
    assert kernel_check.wgmma_loop_spills(_sass(code)) == []
    inside = code[:1] + [(0x0250, "LDL R9, [R1]")] + code[1:]
    assert kernel_check.wgmma_loop_spills(_sass(inside)) == ["0x0250 LDL R9, [R1]"]


def test_sass_counts():
    sass = ("HGMMA.64x64x16.F32.BF16 R1\nUTMAREDG.2D.ADD [UR8]\nUSETMAXREG.DEALLOC.CTAPOOL 0x18\n"
            "WARPGROUP.DEPBAR.LE gsb0, 0x0\nWARPGROUP.ARRIVE\n")
    assert kernel_check.count_sass(sass) == {
        "HGMMA": 1, "UTMAREDG": 1, "USETMAXREG": 1, "WARPGROUP.DEPBAR": 1, "WARPGROUP.ARRIVE": 1}


def _variants():
    try:
        return kernel_check.discover_specs()
    except Exception as exc:  # collection must not crash the suite: the test below reports it
        return [("import-error", repr(exc), None, None, None, None, None)]


@pytest.fixture(scope="module")
def compiled_rows(tmp_path_factory):
    """Every variant compiled once, in a fresh process without ``TRITON_INTERPRET``: Triton's
    interpreter (the CPU suite runs under it) leaves ``triton.language`` builtins patched after
    some kernels it ran, and a Gluon compile in the same process then reaches the interpreter's
    builder (2026-11-26: ``num_tiles - 1`` failed with "'block_argument' object has no attribute
    'dtype'" after tests/test_decode.py, and passed alone)."""
    out = tmp_path_factory.mktemp("kernel_check") / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_check.py"), "--json",
                           str(out)], capture_output=True, text=True, env=env, timeout=1800)
    assert out.exists(), f"no rows:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return {row["name"]: row for row in json.loads(out.read_text())}


@pytest.mark.parametrize("entry", _variants(), ids=lambda e: f"{e[0]}[{e[1]}]")
def test_gluon_kernel_compiles_clean(entry, compiled_rows):
    module, variant, kernel, signature, constexprs, options, expected = entry
    assert kernel is not None, f"GLUON_CHECK_SPECS import failed: {variant}"
    name = f"{module}.{kernel.__name__}[{variant}]"
    row = compiled_rows[name]
    assert not row["problems"], f"{name}: " + "; ".join(row["problems"])
    # Every kernel is warp-specialized (setmaxnreg); wgmma unless its spec says none (the fp8
    # decode runs mma.sync: HGMMA=0), and then exactly the counts the spec expects.
    assert row["counts"]["USETMAXREG"] > 0
    if expected and expected.get("HGMMA") == 0:
        assert row["counts"]["HGMMA"] == 0
    else:
        assert row["counts"]["HGMMA"] > 0
