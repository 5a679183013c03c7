"""`ipa-bench report RESULTS.csv`: a markdown summary of a sweep.

Per dtype, over the N slice: the best variant at each N with its latency, speedup over the
baseline and memory; latency and memory of every variant side by side; the same latency
tables for CUDA-graph replay where the sweep has them (small N, where eager calls are
launch-bound); then every cell that failed, with its reason.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

from harness.plots import NO_NUMBER, length_slice, load_results, shape_label


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(value, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000:  # no scientific notation for large latencies and memory
        return f"{value:.0f}"
    return format(value, spec)


def _cell(rows: pd.DataFrame, variant: str, column: str, spec: str) -> str:
    match = rows[rows["variant"] == variant]
    if match.empty:
        return "not run"
    r = match.iloc[0]
    if r["status"] in NO_NUMBER:
        return r["status"]
    text = _fmt(r[column], spec)
    return text + (" (MISMATCH)" if r["status"] == "mismatch" else "")


MODE_TITLES = {"eager": "eager", "graph": "CUDA-graph replay (launch overhead removed)"}


def _sections(df: pd.DataFrame):
    """(mode, dtype, rows) for every mode and dtype present: eager first, dtypes in order."""
    for mode in MODE_TITLES:
        for dtype, ddf in df[df["mode"] == mode].groupby("dtype", sort=False):
            yield mode, dtype, ddf


def report(df: pd.DataFrame) -> str:
    parts = [f"# ipa-bench results: {', '.join(df['device_name'].unique())}", ""]
    runs = df.groupby("run_id")["started_at"].first().sort_values()
    parts.append(f"Runs: {', '.join(f'{r} ({t})' for r, t in runs.items())}.")
    for mode, dtype, ddf in _sections(df):
        nslice = length_slice(ddf)
        variants = list(dict.fromkeys(nslice["variant"]))
        parts += ["", f"## {dtype}, {MODE_TITLES[mode]}: {shape_label(nslice)}", ""]
        best_rows = []
        for length, rows in nslice.groupby("length"):
            ok = rows[rows["status"] == "ok"].dropna(subset=["median_ms"])
            if ok.empty:
                best_rows.append([str(length), "none passed", "-", "-", "-", "-"])
                continue
            best = ok.loc[ok["median_ms"].idxmin()]
            best_rows.append([str(length), best["variant"], _fmt(best["median_ms"], ".4g"),
                              _fmt(best["speedup_vs_baseline"], ".2f"),
                              _fmt(best["peak_mem_mib"], ".4g"), _fmt(best["err_ratio"], ".2f")])
        parts.append(markdown_table(
            ["N", "fastest passing", "median ms", "speedup vs baseline", "peak MiB", "err/ref"],
            best_rows))
        tables = [("Median latency (ms)", "median_ms", ".4g")]
        if mode == "eager":  # a graph replay's memory is the eager call's
            tables.append(("Extra peak memory (MiB)", "peak_mem_mib", ".4g"))
        for title, column, spec in tables:
            table = [[str(n)] + [_cell(rows, v, column, spec) for v in variants]
                     for n, rows in nslice.groupby("length")]
            parts += ["", f"{title}:", "", markdown_table(["N"] + variants, table)]
    failed = df[df["status"] != "ok"]
    parts += ["", "## Failures and unsupported cells", ""]
    if failed.empty:
        parts.append("None: every cell passed.")
    else:
        parts.append(markdown_table(
            ["variant", "dtype", "mode", "B", "N", "H", "Qp", "Vp", "status", "reason"],
            [[r.variant, r.dtype, r.mode, str(r.batch), str(r.length), str(r.heads),
              str(r.query_points), str(r.value_points), r.status, str(r.reason)]
             for r in failed.itertuples()]))
    return "\n".join(parts) + "\n"


def run_report(args: argparse.Namespace) -> int:
    print(report(load_results(args.results)), end="")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="markdown summary of a sweep",
        description="Print a markdown summary of a sweep: fastest passing variant per N and "
        "dtype, speedups, memory, and every failed or unsupported cell.")
    p.add_argument("results", metavar="RESULTS.csv")
    p.set_defaults(run=run_report)
