"""How the paged decode loops compile for sm_90a on the CPU (no GPU).

Pipelining: a key tile's K/V addresses come from a block-table load, and Triton's pipeliner gives
that load a stage of its own, so at ``num_stages=3`` K and V keep one shared-memory slot unless
the page ids are carried from the iteration before (``PagedDecodeConfig.prefetch_pages``). The
shipped int4 rows rely on the carry (docs/notes.md, 2026-11-27, fifth session); this pins it.

Residency: the split rules count programs an SM (``paged.decode.WIDE_TILE_PROGRAMS_PER_SM`` for
the 128-key tile, the row's ``resident_programs_per_sm`` for the batch cut), and Triton's
register count moves with code outside the hot loop: the in-launch merge one split at a time
held 176 registers, two programs an SM, and its launches ran 9% slower (docs/notes.md,
2026-11-30, thirty-first session). These pin the counts at the plan's launches."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compile(tmp_path, *args) -> tuple[subprocess.CompletedProcess, Path]:
    """``scripts/decode_kernel_stats.py ARGS --keep DIR``: its run and DIR."""
    keep = tmp_path / "k"
    # A fresh process without the interpreter: the CPU suite runs under TRITON_INTERPRET=1,
    # and triton.compile must not see it (tests/test_kernel_check.py has the same caveat).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "decode_kernel_stats.py"),
                           *args, "--keep", str(keep)], capture_output=True, text=True, env=env,
                          timeout=600)
    return proc, keep


def _kv_slots(tmp_path, *args) -> dict[str, int]:
    """Compile the decode kernel (``_compile``) and read the TTGIR's shared-memory allocations:
    element type -> the largest leading (slot) count of its multi-dimensional buffers (the K/V
    tiles)."""
    proc, keep = _compile(tmp_path, *args)
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


# Hopper's per-SM budget: 64K registers, 228 KB of shared memory with 1 KB reserved a block.
SM_REGISTERS, SM_SHARED, BLOCK_RESERVED = 65536, 233472, 1024


def _programs_an_sm(tmp_path, *args) -> int:
    """Programs of the compiled decode kernel (``_compile``; 4 warps) an SM holds by its
    registers (allocated 8 a thread at a time) and shared memory; no spill allowed."""
    proc, _ = _compile(tmp_path, *args)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| fp16")]
    assert rows, f"no stats row:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    regs, spills, shared = int(cells[2]), cells[3], int(cells[6])
    assert spills == "(0, 0)", rows[0]
    by_regs = SM_REGISTERS // (-(-regs // 8) * 8 * 32 * 4)
    return min(by_regs, SM_SHARED // (shared + BLOCK_RESERVED))


@pytest.mark.parametrize("shape, splits", [("48x8192", 1), ("16x4096", 3), ("1x131072", 49)],
                         ids=["one-pass", "merged-in-launch", "combine-kernel"])
def test_wide_tile_launches_fit_the_rule_s_programs_an_sm(tmp_path, shape, splits):
    """The plain d128 row's 128-key tile (``wide_block_n``) at its three launch forms (GQA 32/8,
    fp16): as many programs an SM as ``WIDE_TILE_PROGRAMS_PER_SM`` counts (168 registers,
    73728 B: 3). The merged form held 176 with one split at a time (2)."""
    from kvonce.paged.decode import WIDE_TILE_PROGRAMS_PER_SM
    assert _programs_an_sm(tmp_path, "--format", "plain", "--dtype", "fp16", "--heads", "32/8",
                           "--shape", shape, "--splits", str(splits),
                           "--config", "128,4,2") >= WIDE_TILE_PROGRAMS_PER_SM


@pytest.mark.parametrize("group", range(1, 9))
def test_wide_tile_merge_fits_the_rule_s_programs_an_sm_at_every_group(tmp_path, group):
    """The 128-key tile merging 4 splits in the launch, at the partials-at-once the plan takes
    for ``group`` q heads a KV head (``PagedDecodeConfig.wide_merge_at_once``; fp16, 2 KV heads
    x 48 sequences x 4096 keys: 384 programs, one wave of three an SM). Compiled 2026-12-01 at
    1 / 2 / 4 at once: GROUP 3 176 / 168 with 8 B of spill / 144 registers, GROUP 6 179 / 180 /
    147, GROUP 2 and 4 168 / 168 / 177, the others at most 168 from 2 on (fp16 and bf16 alike).
    At GROUP 6 the 12/2 launches of this size then ran 10-19% faster (H200, graphs)."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    from kvonce.paged.decode import WIDE_TILE_PROGRAMS_PER_SM, _launch_shape_config
    row = _PAGED_DECODE_TABLE[(9, 0)][128]
    config = _launch_shape_config(row, 48 * 2, 4, 4096, 132, group=group)
    assert config.block_n == 128
    assert _programs_an_sm(tmp_path, "--format", "plain", "--dtype", "fp16",
                           "--heads", f"{2 * group}/2", "--shape", "48x4096", "--splits", "4",
                           "--config", "128,4,2", "--merge-at-once",
                           str(config.merge_splits_at_once)) >= WIDE_TILE_PROGRAMS_PER_SM


@pytest.mark.parametrize("group", [3, 5, 6, 7])
@pytest.mark.parametrize("shape, splits", [("48x8192", 1), ("1x131072", 49)],
                         ids=["one-pass", "combine-kernel"])
def test_wide_tile_unmerged_forms_fit_at_uneven_groups(tmp_path, shape, splits, group):
    """The 128-key tile's one pass and combine-kernel launch at the groups whose row-to-head
    math is not a shift (GQA 2 x group / 2, fp16): three programs an SM, as at 32/8 (all 168
    registers, compiled 2026-11-30; the merged form is the one that moved with GROUP)."""
    from kvonce.paged.decode import WIDE_TILE_PROGRAMS_PER_SM
    assert _programs_an_sm(tmp_path, "--format", "plain", "--dtype", "fp16",
                           "--heads", f"{2 * group}/2", "--shape", shape, "--splits", str(splits),
                           "--config", "128,4,2") >= WIDE_TILE_PROGRAMS_PER_SM


def test_row_tile_one_pass_fits_the_cut_s_programs_an_sm(tmp_path):
    """The row's own 64-key one pass (GQA 32/8 66 x 8192, fp16): at least the row's
    ``resident_programs_per_sm`` (the batch cut's wave) by registers and shared memory."""
    from kvonce.kernels.configs import _PAGED_DECODE_TABLE
    row = _PAGED_DECODE_TABLE[(9, 0)][128]  # the Hopper row (the CPU suite runs the interpreter)
    assert _programs_an_sm(tmp_path, "--format", "plain", "--dtype", "fp16", "--heads", "32/8",
                           "--shape", "66x8192", "--splits", "1") >= row.resident_programs_per_sm
