"""`ipa-bench compare OLD.csv NEW.csv [--threshold 5%]`: what changed between two sweeps.

Cells are matched on `harness.results.KEY_COLUMNS` (problem, variant, shape, dtype, mode,
device): a row of one problem is never compared with a row of another. For
each matched cell: the latency ratio new/old of `median_ms`, the memory ratio of
`peak_mem_mib`, and the change of `rel_l2` (ratio new/old). Rows are sorted by the largest
regression first.

Verdicts, and the rules behind them:

* `PASS->FAIL`: the cell's status was `ok` and is now anything else (`mismatch`, `error`,
  `oom`, `unsupported`). Always a failure of the comparison.
* `SLOWER`: latency ratio > 1 + threshold AND the slowdown is outside both runs' noise:
  new `p20_ms` > old `p80_ms`, i.e. the central 60 % of the new samples lies wholly above
  that of the old ones. Equivalently, the median moved by more than the old run's upper
  half-spread (p80 - median) plus the new run's lower half-spread (median - p20). A bigger
  median whose sample spread still overlaps the old one is noise, not a regression. Where
  p20/p80 are missing, the median stands in for them (the threshold alone decides).
* `MORE MEMORY`: memory ratio > 1 + threshold AND the increase exceeds
  `MEMORY_SLACK_MIB` (peak memory is deterministic, but a few-KiB change on a tiny cell is
  not worth a red build). CUDA only: CPU sweeps record no memory.
* `faster`, `less memory`: the same tests in the other direction (reported, never fail).
* `slow host (OLD|NEW): latency not judged`: a row flagged `slow-host` (its host issued ops
  1.3x slower while it was timed than the fastest its run had seen): no latency verdict, as
  for another GPU; memory and status verdicts still apply.
* `host speed A -> B us/op: latency not judged`: a cell timed host-bound on either side whose
  two rows' `host_op_us` differ by 1.3x or more (the two runs' hosts ran at different speeds:
  an H100 A/B of 2026-12-06 saw 7.0 and 10.3 us/op in one sweep, and host-bound cells 1.65x
  apart with the kernels unchanged); as above.
* `fixed`: the status was not `ok` and now is. `still STATUS`: not `ok` in both (e.g.
  `still unsupported`), whatever the numbers.
* `same`: none of the above.
* `other GPU (OLD NAME -> NEW NAME): not judged`: the cell ran on different GPU models
  (`device_name`) in the two files, as cells of a Ray sweep over a mixed cluster can; its
  ratios are shown but compare machines, so no latency or memory verdict is drawn. Status
  verdicts (`PASS->FAIL`, `fixed`) still apply.

The exit status is 1 when any cell is `PASS->FAIL`, `SLOWER` or `MORE MEMORY`, else 0.
Cells present in only one file are listed (e.g. a sweep run with `--max-length`) and do
not change the exit status. `--mode graph` keeps only CUDA-graph rows: between two processes
on the H200 (same code, results/h200-2026-12-02-quick vs -default) launch-bound eager rows
moved by up to 1.9x with tight within-run spreads, graph rows by at most 1 %.
If a file holds a key more than once (concatenated runs), its
last row counts. A change of device name between the files is reported: comparing two
different GPUs measures the GPUs, not the code. So is a change of host speed, where the
`metadata.json` beside each file records it (`host_op_us`, the host's time to issue one small
torch op) and the two differ by more than `HOST_DIFFERENCE`: a `host-bound` row then times the
hosts (two H100 VMs of 2026-12-06 issued a Triton launch in 19 and 31 us). So is a change of
the timing's busy wait before each sample (`host_spin_ms`: 2 in the runs of 2026-12-06's
twenty-third session, 0 before and after), which changes what a host-bound row measures.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from harness.report import markdown_table
from harness.results import (
    KEY_COLUMNS,
    METADATA_JSON,
    SLOW_HOST,
    has_flag,
    latest_per_key,
    metadata_runs,
    read_results,
)
from variants.problem import IPAInputError

MEMORY_SLACK_MIB = 1.0
HOST_DIFFERENCE = 1.2  # host_op_us ratio beyond which the summary notes the hosts differ
FAILING = ("PASS->FAIL", "SLOWER", "MORE MEMORY")


def parse_threshold(text: str) -> float:
    """'5%' -> 0.05; '0.05' -> 0.05. A bare number >= 1 is refused as ambiguous."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a percentage like 5% or a fraction like 0.05, got {text!r}") from None
    if not text.endswith("%") and value >= 1:
        raise argparse.ArgumentTypeError(
            f"expected a fraction below 1 or a percentage, got {text!r} (did you mean {text}%?)")
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive threshold, got {text!r}")
    return value


def load(path: str | Path, what: str) -> pd.DataFrame:
    """A results CSV (`read_results`) with its key columns as strings, one row per key (the
    last one)."""
    df = read_results(path, what)
    df[KEY_COLUMNS] = df[KEY_COLUMNS].astype(str)
    return latest_per_key(df)


def run_figure(path: str | Path, df: pd.DataFrame, key: str,
               missing: float | None = None) -> float | None:
    """The median of `key` over the runs that wrote `df`'s rows, from the `metadata.json`
    beside the results file at `path`; a run that did not record it counts as `missing` (None:
    not at all). None where no run counts (or there is no such file, or it is not an ipa-bench
    one)."""
    try:
        runs = metadata_runs(Path(path).parent / METADATA_JSON)
    except IPAInputError:
        return None
    values = [runs[run_id].get(key, missing) for run_id in set(df["run_id"].astype(str))
              if run_id in runs]
    values = [v for v in values if isinstance(v, int | float)]
    return statistics.median(values) if values else None


def host_op_us(path: str | Path, df: pd.DataFrame) -> float | None:
    """The hosts' speed (`measure.host_op_us`) of the runs that wrote `df`'s rows."""
    return run_figure(path, df, "host_op_us")


def host_spin_ms(path: str | Path, df: pd.DataFrame) -> float | None:
    """The timing's busy wait before each sample (`TimingPolicy.host_spin_ms`) of the runs that
    wrote `df`'s rows: 0 for a run recorded before it existed (2026-12-06)."""
    return run_figure(path, df, "host_spin_ms", missing=0.0)


@dataclass
class Comparison:
    cells: pd.DataFrame  # one row per matched cell, sorted worst first
    only_old: pd.DataFrame  # key columns of cells missing from NEW
    only_new: pd.DataFrame  # key columns of cells missing from OLD
    device_names: tuple[list[str], list[str]]
    threshold: float
    host_op_us: tuple[float | None, float | None] = (None, None)  # OLD's, NEW's
    host_spin_ms: tuple[float | None, float | None] = (None, None)  # OLD's, NEW's

    @property
    def failed(self) -> pd.DataFrame:
        return self.cells[self.cells["verdict"].isin(FAILING)]


def _ratio(new: float, old: float) -> float:
    if pd.isna(new) or pd.isna(old) or old <= 0:
        return math.nan
    return new / old


def _verdict(row, threshold: float) -> str:
    old_ok, new_ok = row.status_old == "ok", row.status_new == "ok"
    if old_ok and not new_ok:
        return "PASS->FAIL"
    if not old_ok:
        return "fixed" if new_ok else f"still {row.status_new}"
    if str(row.device_name_old) != str(row.device_name_new):
        # A mixed-GPU run (Ray) put this cell on another model: the ratios compare machines.
        return f"other GPU ({row.device_name_old} -> {row.device_name_new}): not judged"
    verdicts = []
    lat = row.latency_ratio
    slowed = [side for side, flags in (("OLD", row.flags_old), ("NEW", row.flags_new))
              if "slow-host" in str(flags).split(";")]
    speeds = _host_speeds(row)
    if slowed and not math.isnan(lat):  # the host's speed moved, not only the code
        verdicts.append(f"slow host ({' and '.join(slowed)}): latency not judged")
    elif speeds and not math.isnan(lat):
        verdicts.append(f"host speed {speeds[0]:.3g} -> {speeds[1]:.3g} us/op: latency not "
                        "judged")
    elif not math.isnan(lat):
        old_p20 = row.median_ms_old if pd.isna(row.p20_ms_old) else row.p20_ms_old
        old_p80 = row.median_ms_old if pd.isna(row.p80_ms_old) else row.p80_ms_old
        new_p20 = row.median_ms_new if pd.isna(row.p20_ms_new) else row.p20_ms_new
        new_p80 = row.median_ms_new if pd.isna(row.p80_ms_new) else row.p80_ms_new
        if lat > 1 + threshold and new_p20 > old_p80:
            verdicts.append("SLOWER")
        elif lat < 1 / (1 + threshold) and new_p80 < old_p20:
            verdicts.append("faster")
    mem = row.memory_ratio
    if not math.isnan(mem):
        delta = row.peak_mem_mib_new - row.peak_mem_mib_old
        if mem > 1 + threshold and delta > MEMORY_SLACK_MIB:
            verdicts.append("MORE MEMORY")
        elif mem < 1 / (1 + threshold) and -delta > MEMORY_SLACK_MIB:
            verdicts.append("less memory")
    failing = [v for v in verdicts if v in FAILING]
    return ", ".join(failing or verdicts) or "same"


def _host_speeds(row) -> tuple[float, float] | None:
    """(OLD's, NEW's) `host_op_us` of a cell that either side timed host-bound, where the two
    differ by `SLOW_HOST` or more: its latency then times the hosts, not only the code. None
    otherwise, or where either is unknown (rows written before the column)."""
    bound = any("host-bound" in str(flags).split(";") for flags in (row.flags_old,
                                                                      row.flags_new))
    old_us = pd.to_numeric(getattr(row, "host_op_us_old", math.nan), errors="coerce")
    new_us = pd.to_numeric(getattr(row, "host_op_us_new", math.nan), errors="coerce")
    if not bound or not (old_us > 0 and new_us > 0):
        return None
    return (old_us, new_us) if max(old_us, new_us) >= SLOW_HOST * min(old_us, new_us) else None


def compare(old: pd.DataFrame, new: pd.DataFrame, threshold: float = 0.05,
            host_op_us: tuple[float | None, float | None] = (None, None),
            host_spin_ms: tuple[float | None, float | None] = (None, None)) -> Comparison:
    """Match `old` and `new` (results DataFrames, as `load` returns) cell by cell;
    `host_op_us`: their hosts' speeds, `host_spin_ms`: their timings' busy waits, where known
    (`host_op_us`, `host_spin_ms`)."""
    merged = old.merge(new, on=KEY_COLUMNS, how="outer", suffixes=("_old", "_new"),
                       indicator=True)
    only_old = merged.loc[merged["_merge"] == "left_only", KEY_COLUMNS]
    only_new = merged.loc[merged["_merge"] == "right_only", KEY_COLUMNS]
    cells = merged[merged["_merge"] == "both"].drop(columns="_merge").copy()
    for column in ("median_ms", "p20_ms", "p80_ms", "peak_mem_mib", "rel_l2"):
        for side in ("_old", "_new"):
            cells[column + side] = pd.to_numeric(cells[column + side], errors="coerce")
    cells["latency_ratio"] = [_ratio(n, o) for n, o in
                              zip(cells["median_ms_new"], cells["median_ms_old"], strict=True)]
    cells["memory_ratio"] = [_ratio(n, o) for n, o in
                             zip(cells["peak_mem_mib_new"], cells["peak_mem_mib_old"],
                                 strict=True)]
    cells["rel_l2_change"] = [_ratio(n, o) for n, o in
                            zip(cells["rel_l2_new"], cells["rel_l2_old"], strict=True)]
    cells["verdict"] = [_verdict(r, threshold) for r in cells.itertuples()]
    # Worst first: failures of the comparison (pass->fail first), then by the largest ratio.
    rank = {"PASS->FAIL": 0, "SLOWER": 1, "MORE MEMORY": 1}
    cells["_rank"] = [min((rank.get(v, 2) for v in verdict.split(", ")), default=2)
                      for verdict in cells["verdict"]]
    cells["_worst"] = cells[["latency_ratio", "memory_ratio"]].max(axis=1).fillna(0.0)
    cells = cells.sort_values(["_rank", "_worst"], ascending=[True, False], kind="stable")
    cells = cells.drop(columns=["_rank", "_worst"]).reset_index(drop=True)
    names = (sorted(old["device_name"].dropna().astype(str).unique()),
             sorted(new["device_name"].dropna().astype(str).unique()))
    return Comparison(cells, only_old.reset_index(drop=True), only_new.reset_index(drop=True),
                      names, threshold, host_op_us, host_spin_ms)


def _num(value, spec: str) -> str:
    return "-" if pd.isna(value) else format(value, spec)


def _cell_label(r) -> list[str]:
    shape = (f"B{r.batch} N{r.length} H{r.heads} Qp{r.query_points} Vp{r.value_points} "
             f"D{r.node_dim}/{r.pair_dim}")
    if int(r.head_dim) != int(r.node_dim) // int(r.heads):  # a free per-head width (openfold)
        shape += f" C{r.head_dim}"
    variant = r.variant if r.problem == "simplified" else f"{r.problem}:{r.variant}"
    return [variant, r.dtype, r.mode, r.device, shape]


LABEL_HEADER = ["variant", "dtype", "mode", "device", "shape"]
HEADER = LABEL_HEADER + ["status", "old ms [p20, p80]", "new ms [p20, p80]", "latency",
                         "old MiB", "new MiB", "memory", "rel_l2 new (x old)", "verdict"]


def _spread(median, p20, p80) -> str:
    if pd.isna(median):
        return "-"
    if pd.isna(p20) or pd.isna(p80):
        return format(median, ".4g")
    return f"{median:.4g} [{p20:.4g}, {p80:.4g}]"


def _times(ratio) -> str:
    return "-" if pd.isna(ratio) else f"{ratio:.3f}x"


def table_rows(result: Comparison) -> list[list[str]]:
    rows = []
    for r in result.cells.itertuples():
        status = r.status_old if r.status_old == r.status_new else (
            f"{r.status_old} -> {r.status_new}")
        if r.verdict == "PASS->FAIL" and isinstance(r.reason_new, str) and r.reason_new:
            status += f": {r.reason_new}"
        rows.append(_cell_label(r) + [
            status,
            _spread(r.median_ms_old, r.p20_ms_old, r.p80_ms_old),
            _spread(r.median_ms_new, r.p20_ms_new, r.p80_ms_new),
            _times(r.latency_ratio),
            _num(r.peak_mem_mib_old, ".4g"), _num(r.peak_mem_mib_new, ".4g"),
            _times(r.memory_ratio),
            _num(r.rel_l2_new, ".2e") + ("" if pd.isna(r.rel_l2_change)
                                         else f" ({r.rel_l2_change:.3g}x)"),
            r.verdict,
        ])
    return rows


def summary_lines(result: Comparison) -> list[str]:
    lines = []
    old_names, new_names = result.device_names
    if old_names != new_names:
        lines.append(f"note: the devices differ (OLD {old_names}, NEW {new_names}): the ratios "
                     "compare the machines as much as the code")
    cells = result.cells
    bound = int((has_flag(cells.rename(columns={"flags_old": "flags"}), "host-bound")
                 | has_flag(cells.rename(columns={"flags_new": "flags"}), "host-bound")).sum())
    old_host, new_host = result.host_op_us
    if old_host and new_host and max(old_host, new_host) > HOST_DIFFERENCE * min(old_host,
                                                                                  new_host):
        lines.append(f"note: the hosts differ (OLD issues a small torch op in {old_host:.1f} us, "
                     f"NEW in {new_host:.1f} us): {bound} matched cell(s) flagged host-bound time "
                     "the hosts as much as the code (--mode graph compares the kernels)")
    old_spin, new_spin = result.host_spin_ms
    if old_spin is not None and new_spin is not None and old_spin != new_spin:
        lines.append(f"note: the timings differ (the host busy for {old_spin:g} ms before each "
                     f"OLD sample, {new_spin:g} ms before each NEW one): {bound} matched cell(s) "
                     "flagged host-bound time the host's state as much as the code "
                     "(docs/reliability.md; --mode graph compares the kernels)")
    for label, frame in (("only in OLD (not rerun)", result.only_old),
                         ("only in NEW (new cells)", result.only_new)):
        if not frame.empty:
            lines.append(f"{len(frame)} cell(s) {label}:")
            lines += ["  " + " ".join(_cell_label(r)) for r in frame.itertuples()]
    failed = result.failed
    counts = result.cells["verdict"].value_counts()
    lines.append(f"{len(result.cells)} matched cell(s), threshold {result.threshold:.1%}: "
                 + ", ".join(f"{n} {v}" for v, n in counts.items()))
    lines.append(f"REGRESSION: {len(failed)} cell(s) slower, bigger or failing" if len(failed)
                 else "no regression")
    return lines


def run_compare(args: argparse.Namespace) -> int:
    old, new = load(args.old, "OLD.csv"), load(args.new, "NEW.csv")
    if args.mode:
        old, new = old[old["mode"] == args.mode], new[new["mode"] == args.mode]
    result = compare(old, new, args.threshold,
                     (host_op_us(args.old, old), host_op_us(args.new, new)),
                     (host_spin_ms(args.old, old), host_spin_ms(args.new, new)))
    if result.cells.empty:
        problems = [sorted(set(df["problem"])) for df in (old, new)]
        hint = (f"; OLD holds problem(s) {problems[0]}, NEW {problems[1]}, and rows of "
                "different problems are never compared" if not set(problems[0]) & set(
                    problems[1]) else "")
        raise IPAInputError(
            f"OLD.csv, NEW.csv: no cell in common{f' in mode {args.mode!r}' if args.mode else ''}"
            f" ({len(result.only_old)} only in OLD, {len(result.only_new)} only in NEW"
            f"{hint}): nothing to compare")
    rows = table_rows(result)
    if args.markdown:
        print(markdown_table(HEADER, rows) if rows else "No matched cells.")
        print()
        print("\n".join(summary_lines(result)))
    else:
        console = Console(width=max(Console().width, 220))
        table = Table(title=f"ipa-bench compare: {args.old} -> {args.new}")
        for column in HEADER:
            wrap = column in ("status", "verdict")
            table.add_column(column, overflow="fold", no_wrap=not wrap)
        for row in rows:
            failing = any(v in row[-1] for v in FAILING)
            table.add_row(*row, style="bold red" if failing else None)
        console.print(table)
        for line in summary_lines(result):
            console.print(line, markup=False, highlight=False)
    return 1 if len(result.failed) else 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="compare two sweeps cell by cell; exit 1 on a regression",
        description="Match two results CSVs cell by cell (problem, variant, shape, dtype, "
        "mode, device) and show the latency ratio, memory ratio and error change, worst first. "
        "Exit status 1 when a cell got slower or bigger past the threshold and outside both "
        "runs' noise (new p20 above old p80), or a cell that passed now fails.")
    p.add_argument("old", metavar="OLD.csv")
    p.add_argument("new", metavar="NEW.csv")
    p.add_argument("--threshold", type=parse_threshold, default=0.05, metavar="PCT",
                   help="relative change that counts, e.g. 5%% or 0.05 (default 5%%)")
    p.add_argument("--mode", choices=["eager", "graph"],
                   help="compare only the rows of this timing mode; `graph` for a gate across "
                   "processes: launch-bound eager rows drift more between runs than within one "
                   "(docs/benchmarks.md)")
    p.add_argument("--markdown", action="store_true",
                   help="print a markdown table (for a pull-request comment) instead")
    p.set_defaults(run=run_compare)
