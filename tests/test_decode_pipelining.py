"""How deep Triton pipelines the paged decode loops, compiled for sm_90a on the CPU (no GPU):
a key tile's K/V addresses come from a block-table load, and Triton's pipeliner gives that load
a stage of its own, so at ``num_stages=3`` K and V keep one shared-memory slot unless the page
ids are carried from the iteration before (``PagedDecodeConfig.prefetch_pages``). The shipped
int4 rows rely on the carry (docs/notes.md, 2026-11-27, fifth session); this pins it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _kv_slots(tmp_path, *args) -> dict[str, int]:
    """Compile the decode kernel (``scripts/decode_kernel_stats.py ARGS --keep``) and read the
    TTGIR's shared-memory allocations: element type -> the largest leading (slot) count of its
    multi-dimensional buffers (the K/V tiles)."""
    keep = tmp_path / "k"
    # A fresh process without the interpreter: the CPU suite runs under TRITON_INTERPRET=1,
    # and triton.compile must not see it (tests/test_kernel_check.py has the same caveat).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "decode_kernel_stats.py"),
                           *args, "--keep", str(keep)], capture_output=True, text=True, env=env,
                          timeout=600)
    ttgir = list(keep.glob("*.ttgir"))
    assert ttgir, f"no TTGIR:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    slots: dict[str, int] = {}
    for n, dims, ty in re.findall(r"ttg\.local_alloc\s*:\s*\(\)\s*->\s*!ttg\.memdesc<(\d+)x"
                                  r"((?:\d+x)+)(\w+)", ttgir[0].read_text()):
        if dims.count("x") >= 2:  # [slots, rows, cols]: a K or V tile (not a [slots, 128] vector)
            slots[ty] = max(slots.get(ty, 0), int(n))
    return slots


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_int4_rows_keep_two_kv_tiles_in_flight(tmp_path, dtype):
    """The int4 rows (3 stages, page ids carried): K's byte chunks (i8) and V's 16-bit units
    (i16) have two shared-memory slots each."""
    slots = _kv_slots(tmp_path, "--format", "int4", "--dtype", dtype)
    assert slots.get("i8") == 2 and slots.get("i16") == 2, slots


@pytest.mark.parametrize("fmt", ["int4", "fp8_e4m3"])
def test_three_stages_without_carried_pages_keep_one_kv_slot(tmp_path, fmt):
    """Without the carry, the third stage goes to the page ids and K/V keep one slot: what made
    every earlier "3 stages" measurement of these loops a measurement of something else."""
    slots = _kv_slots(tmp_path, "--format", fmt, "--dtype", "fp16", "--config", "128,4,3",
                      "--no-prefetch-pages")
    assert slots.get("i8") == 1 and slots.get("i16") == 1, slots
