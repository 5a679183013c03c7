"""Where a kernel's warps wait, from Nsight Compute's per-SASS-instruction counters (no GPU needed).

Input: the source page of an ncu report as CSV (`ncu --section SourceCounters ... -o REP`, then
`ncu -i REP.ncu-rep --page source --csv --print-source sass`, gzipped or not; `ncu_session.sh`
with NCU_SOURCE=1 writes them). Instructions executed equally often belong to the same code
region: a loop body run once per key tile by each warp of a role, its prologue, an inner loop.
So the instructions are grouped by their execution count, and for each group the tool prints its
share of the kernel's warp-stall samples, its stall reasons and its top instructions:

    python3 gpu_diagnostics/ncu_stalls.py SRC.csv[.gz] [--groups 6] [--top 8]
    python3 gpu_diagnostics/ncu_stalls.py AFTER.csv.gz --against BEFORE.csv.gz

With --against, each region of AFTER beside the region of BEFORE that ran as often: the
instructions it executed (warp-level, all launches), its share of the samples and its barrier
share, before -> after: what a change did to each role (the prediction's check).

Reading it: a sample says where a warp waits, not that the kernel waits. In a kernel whose warp
roles meet at a barrier every tile, the critical role is the one that seldom waits at the barrier;
the other roles' stalls are hidden behind it, and cutting them changes nothing (thirty-second
session: the af2 tensor-core kernel's copies, ~1/4 of a role's samples, cut to a third of their
instructions for -1 to -3 %). Read a group's `barrier` share first.

(thirty-second session: openfold cuda-fused at N = 2048 showed the bf16 attention warps' loop
and the fp32 pair warps' bias loop as the critical paths; results/h100-2026-12-07-thirty-second-
session/).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
SHARED_WAVEFRONTS = "L1 Wavefronts Shared"


@dataclass
class Instruction:
    address: str
    source: str
    executed: float
    samples: float
    wavefronts: float
    stalls: dict[str, float]


@dataclass
class Group:
    executed: float
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def samples(self) -> float:
        return sum(i.samples for i in self.instructions)


def read_source_page(path: Path) -> list[Instruction]:
    """The instructions of the CSV's first kernel (a `"Kernel Name",...` line, then the header)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as raw:
        rows = list(csv.reader(io.TextIOWrapper(raw, "utf-8")))
    start = 1 if rows and rows[0] and rows[0][0] == "Kernel Name" else 0
    header, body = rows[start], rows[start + 1:]
    if SAMPLES not in header or EXECUTED not in header:
        raise SystemExit(f"{path}: expected ncu's source page with SourceCounters (columns "
                         f"{SAMPLES!r}, {EXECUTED!r}); got {header[:6]}")
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def number(row: list[str], name: str) -> float:
        i = col.get(name)
        return float(row[i] or 0) if i is not None and i < len(row) else 0.0

    out = []
    for row in body:
        if len(row) < len(header) or row[0] == "Kernel Name":
            break  # the next kernel's section
        out.append(Instruction(row[col["Address"]], row[col["Source"]].strip(),
                               number(row, EXECUTED), number(row, SAMPLES),
                               number(row, SHARED_WAVEFRONTS),
                               {r.removeprefix("stall_"): number(row, r) for r in reasons}))
    return out


def group_by_execution(instructions: list[Instruction], tolerance: float = 0.02) -> list[Group]:
    """Instructions whose execution counts agree within `tolerance` (relative), by samples."""
    groups: list[Group] = []
    for ins in sorted(instructions, key=lambda i: i.executed):
        if groups and ins.executed <= groups[-1].executed * (1 + tolerance) + 1:
            groups[-1].instructions.append(ins)
        else:
            groups.append(Group(ins.executed, [ins]))
    for grp in groups:  # back in address order
        grp.instructions.sort(key=lambda i: int(i.address, 16) if i.address else 0)
    return sorted(groups, key=lambda grp: -grp.samples)


def reasons_line(instructions: list[Instruction], top: int = 6) -> str:
    total = Counter()
    for ins in instructions:
        total.update(ins.stalls)
    whole = sum(total.values()) or 1.0
    return ", ".join(f"{name} {100 * v / whole:.0f}%" for name, v in total.most_common(top) if v)


def report(path: Path, groups_shown: int, top: int) -> str:
    instructions = read_source_page(path)
    samples = sum(i.samples for i in instructions) or 1.0
    wavefronts = sum(i.wavefronts for i in instructions) or 1.0
    lines = [f"== {path.name}: {len(instructions)} instructions, {samples:.0f} stall samples"]
    for grp in group_by_execution(instructions)[:groups_shown]:
        share = 100 * grp.samples / samples
        smem = 100 * sum(i.wavefronts for i in grp.instructions) / wavefronts
        lines.append(f"-- executed {grp.executed:.3g} times: {len(grp.instructions)} instructions, "
                     f"{share:.1f}% of samples, {smem:.0f}% of shared wavefronts; "
                     f"{reasons_line(grp.instructions)}")
        for ins in sorted(grp.instructions, key=lambda i: -i.samples)[:top]:
            lines.append(f"   {ins.address[-5:]:>5} {100 * ins.samples / samples:5.2f}%  "
                         f"{ins.source[:60]:60}  {reasons_line([ins], 2)}")
    return "\n".join(lines)


def barrier_share(instructions: list[Instruction]) -> float:
    total = sum(sum(i.stalls.values()) for i in instructions) or 1.0
    return 100 * sum(i.stalls.get("barrier", 0.0) for i in instructions) / total


def compare(after: Path, before: Path, groups_shown: int) -> str:
    """AFTER's regions beside BEFORE's that ran as often (execution counts within 2 %)."""
    new, old = read_source_page(after), read_source_page(before)
    new_samples = sum(i.samples for i in new) or 1.0
    old_samples = sum(i.samples for i in old) or 1.0
    old_groups = group_by_execution(old)
    def name(path: Path) -> str:
        return f"{path.parent.name}/{path.name}"

    lines = [f"== {name(after)} against {name(before)}: executed instructions "
             f"{sum(i.executed for i in old):.4g} -> {sum(i.executed for i in new):.4g}"]
    for grp in group_by_execution(new)[:groups_shown]:
        match = next((g for g in old_groups
                      if abs(g.executed - grp.executed) <= 0.02 * max(g.executed, 1.0)), None)
        now = (f"{sum(i.executed for i in grp.instructions):.4g} executed, "
               f"{100 * grp.samples / new_samples:.1f}% of samples, "
               f"barrier {barrier_share(grp.instructions):.0f}%")
        if match is None:
            lines.append(f"-- executed {grp.executed:.3g} times: new region: {now}")
            continue
        lines.append(f"-- executed {grp.executed:.3g} times: "
                     f"{sum(i.executed for i in match.instructions):.4g} -> {now.split(',')[0]}; "
                     f"{100 * match.samples / old_samples:.1f}% -> "
                     f"{100 * grp.samples / new_samples:.1f}% of samples; barrier "
                     f"{barrier_share(match.instructions):.0f}% -> "
                     f"{barrier_share(grp.instructions):.0f}%")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", type=Path, help="ncu source page(s), .csv or .csv.gz")
    parser.add_argument("--groups", type=int, default=6, help="code regions to show (default 6)")
    parser.add_argument("--top", type=int, default=8, help="instructions per region (default 8)")
    parser.add_argument("--against", type=Path, metavar="BEFORE",
                        help="compare each page's regions with this earlier page's")
    args = parser.parse_args()
    if args.against:
        print("\n\n".join(compare(p, args.against, args.groups) for p in args.csv))
    else:
        print("\n\n".join(report(p, args.groups, args.top) for p in args.csv))


if __name__ == "__main__":
    main()
