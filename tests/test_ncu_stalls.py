"""gpu_diagnostics/ncu_stalls.py on a small source page written here: regions by execution count,
their share of the stall samples, and the reasons."""

import csv
import gzip

import pytest

from gpu_diagnostics.ncu_stalls import compare, group_by_execution, read_source_page, report

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "L1 Wavefronts Shared", "stall_barrier", "stall_short_sb", "stall_barrier (Not Issued)"]
ROWS = [  # a prologue run once, a loop body run 1000 times (one count off by 0.5 %), a tail
    ["0x0010", "MOV R1, R2", "1", "4", "0", "0", "1", "0"],
    ["0x0020", "LDS R3, [R4]", "30", "1000", "64", "0", "30", "0"],
    ["0x0030", "FADD R5, R3, R3", "50", "1005", "0", "5", "45", "2"],
    ["0x0040", "BAR.SYNC 0x0", "19", "1000", "0", "19", "0", "7"],
]


def write_page(path, compress, rows=ROWS):
    opener = gzip.open if compress else open
    with opener(path, "wt", newline="") as f:
        out = csv.writer(f)
        out.writerow(["Kernel Name", "void k(Args)"])
        out.writerow(HEADER)
        out.writerows(rows)


@pytest.mark.parametrize("compress", [False, True])
def test_regions_by_execution_count(tmp_path, compress):
    path = tmp_path / ("page.csv.gz" if compress else "page.csv")
    write_page(path, compress)
    instructions = read_source_page(path)
    assert [i.address for i in instructions] == ["0x0010", "0x0020", "0x0030", "0x0040"]
    assert instructions[2].stalls == {"barrier": 5.0, "short_sb": 45.0}  # "Not Issued" left out
    loop, prologue = group_by_execution(instructions)
    assert [i.address for i in loop.instructions] == ["0x0020", "0x0030", "0x0040"]
    assert loop.samples == 99 and prologue.samples == 1
    text = report(path, groups_shown=2, top=1)
    assert "3 instructions, 99.0% of samples, 100% of shared wavefronts" in text
    assert "short_sb 76%, barrier 24%" in text  # (30 + 45) / 99 and 24 / 99
    assert "FADD R5, R3, R3" in text and "LDS R3" not in text  # top 1: the most sampled


def test_refuses_a_page_without_source_counters(tmp_path):
    path = tmp_path / "details.csv"
    path.write_text('"ID","Metric Name","Metric Value"\n"0","Duration","1.0"\n')
    with pytest.raises(SystemExit, match="SourceCounters"):
        read_source_page(path)


def test_compare_matches_regions_by_execution_count(tmp_path):
    before, after = tmp_path / "before.csv", tmp_path / "after.csv"
    write_page(before, False)
    # the change: the loop's load gone, its FADD now waits at the barrier, a new region
    write_page(after, False, [ROWS[0],
                              ["0x0030", "FADD R5, R3, R3", "40", "1000", "0", "40", "0", "0"],
                              ROWS[3], ["0x0050", "EXIT", "1", "7", "0", "0", "0", "0"]])
    text = compare(after, before, groups_shown=3)
    assert "executed instructions 3009 -> 2011" in text.splitlines()[0]
    loop = next(line for line in text.splitlines() if "executed 1e+03 times" in line)
    assert "3005 -> 2000 executed" in loop
    assert "99.0% -> 96.7% of samples" in loop and "barrier 24% -> 100%" in loop  # 59 of 61
    assert "executed 7 times: new region" in text
