"""The loops of a SASS dump (``cuobjdump -sass``, or ``kernel_check.py --keep DIR``'s ``.sass``)
that hold a marker opcode (UTMALDG: the loader's; HGMMA: the consumers'), each with its
instruction count, an opcode histogram and the stall cycles ptxas planned (the control bits'
stall field: the static schedule, without scoreboard waits); with ``--segments``, the same per
straight stretch between a loop's branches (e.g. the softmax's masked and unmasked paths).

    python scripts/sass_loops.py FILE.sass [--marker HGMMA] [--segments] [--top 12]
"""
import argparse
import re
from collections import Counter

INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
CONTROL = re.compile(r"\s+/\* (0x[0-9a-f]{16}) \*/")


def parse(path: str) -> list:
    """``[(address, text, stall cycles)]``: the stall count is bits 105-108 of the 128-bit
    instruction (bits 41-44 of its second 64-bit word, the dump's next line)."""
    lines = open(path).read().split("\n")
    out = []
    for i, line in enumerate(lines[:-1]):
        m = INSTRUCTION.match(line)
        c = CONTROL.match(lines[i + 1])
        if m and c:
            out.append((int(m.group(1), 16), m.group(2), (int(c.group(1), 16) >> 41) & 0xF))
    return out


def opcode(text: str) -> str:
    words = text.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def summary(body: list, top: int) -> str:
    counts = Counter(opcode(t) for _, t, _ in body)
    stalls = sum(s for _, _, s in body)
    return (f"{len(body)} instructions, {stalls} planned stall cycles; "
            + ", ".join(f"{k} {v}" for k, v in counts.most_common(top)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("--marker", default="HGMMA")
    ap.add_argument("--segments", action="store_true")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    code = parse(args.sass)
    index = {a: i for i, (a, _, _) in enumerate(code)}
    for i, (addr, text, _) in enumerate(code):
        target = re.search(r"BRA\s+(?:\S+\s+)?0x([0-9a-f]+)", text)
        if not target or int(target.group(1), 16) >= addr:
            continue
        start = index.get(int(target.group(1), 16))
        if start is None:
            continue
        body = code[start:i + 1]
        if not any(opcode(t) == args.marker for _, t, _ in body):
            continue
        print(f"loop {body[0][0]:#x}-{addr:#x}: {summary(body, args.top)}")
        if args.segments:   # straight stretches: split after each branch and at each target
            cuts = {body[0][0]}
            for a, t, _ in body:
                m = re.search(r"BRA\s+(?:\S+\s+)?0x([0-9a-f]+)", t)
                if m:
                    cuts.add(a + 0x10)
                    cuts.add(int(m.group(1), 16))
            seg = []
            for ins in body:
                if ins[0] in cuts and seg:
                    print(f"  {seg[0][0]:#x}-{seg[-1][0]:#x}: {summary(seg, 6)}")
                    seg = []
                seg.append(ins)
            print(f"  {seg[0][0]:#x}-{seg[-1][0]:#x}: {summary(seg, 6)}")


if __name__ == "__main__":
    main()
