"""`ipa-bench report RESULTS.csv [...]`: a markdown summary of a sweep (or of several, as one).

Per problem and GPU model (when a file has several), pass and dtype, over the N slice (the
shape with the most lengths; among equals the default layer): the best variant at each N with
its latency, speedup over the baseline and memory; latency and memory of every variant side by
side; where the sweep has other shapes (slices), every shape's fastest variant and each
variant's time over it; the same tables for CUDA-graph replay where the sweep has them (small
N, where eager calls are launch-bound); then every cell that failed, with its reason. Rows of
different problems (`simplified`, `openfold`) never share a table.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd

from harness.plots import length_slice, rank_shapes, several_shapes, shape_label
from harness.results import (
    ERR_RATIO_LABEL,
    FLAGS,
    NO_NUMBER,
    has_flag,
    latest_per_key,
    read_results,
)
from harness.runner import PASSES
from variants.problem import IPAInputError


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table of strings, columns padded to line up (pandas' to_markdown,
    i.e. tabulate). Cells are printed as given (no number parsing); a `|` in a cell (a
    reason's joined lines) is escaped so it stays one cell."""
    def escape(text) -> str:
        return str(text).replace("|", "\\|")

    frame = pd.DataFrame([[escape(c) for c in r] for r in rows],
                         columns=[escape(h) for h in header])
    return frame.to_markdown(index=False, tablefmt="github", disable_numparse=True)


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
    flags = str(r["flags"]).split(";")  # as has_flag
    if column == "median_ms" and "noisy" in flags:
        text += " (noisy)"
    if column == "median_ms" and "host-bound" in flags:
        text += " (slow host)" if "slow-host" in flags else " (host)"
    return text + (" (MISMATCH)" if r["status"] == "mismatch" else "")


MODE_TITLES = {"eager": "eager", "graph": "CUDA-graph replay (launch overhead removed)"}


def _sections(df: pd.DataFrame):
    """(title, mode, rows) for every problem, GPU model, pass, mode and dtype present:
    forward before training, eager first, dtypes in order. Rows of different problems, or of
    different GPU models (a Ray sweep over a mixed cluster), never share a table: their
    titles name the problem and the model."""
    problems = list(dict.fromkeys(df["problem"].astype(str)))
    names = list(dict.fromkeys(df["device_name"].astype(str)))
    for problem, name in [(p, n) for p in problems for n in names]:
        on_device = df[(df["problem"].astype(str) == problem)
                       & (df["device_name"].astype(str) == name)]
        labels = ([f"problem {problem}"] if len(problems) > 1 else []) + (
            [name] if len(names) > 1 else [])
        prefix = f"{', '.join(labels)}: " if labels else ""
        for pass_name in PASSES:
            for mode in MODE_TITLES:
                rows = on_device[(on_device["pass"] == pass_name) & (on_device["mode"] == mode)]
                for dtype, ddf in rows.groupby("dtype", sort=False):
                    what = MODE_TITLES[mode] if pass_name == "forward" else (
                        f"training step (forward+backward), {MODE_TITLES[mode]}")
                    yield f"{prefix}{dtype}, {what}", mode, ddf


def shapes_table(rows: pd.DataFrame) -> list[str]:
    """Every shape and N of a section's rows (a sweep of slices, `plots.rank_shapes`): the
    fastest passing variant and each variant's median over the fastest's (1.00 is the fastest;
    a status where it has no time), so that where a variant loses, and by how much, shows at
    a glance. Only the shape columns that vary are shown."""
    ranked = rank_shapes(rows)
    cells = [[_fmt(v, ".4g") if column == "ms" else _fmt(v, ".2f") if isinstance(v, float)
              else str(v) for column, v in line.items()] for _, line in ranked.iterrows()]
    return ["Every shape: each variant's median over the fastest passing one's (1.00 = fastest):",
            "", markdown_table(list(ranked.columns), cells)]


def report(df: pd.DataFrame) -> str:
    """The markdown summary of results rows (`read_results`' DataFrame, or a part of one)."""
    if df.empty:
        raise IPAInputError("report: no rows to summarise")
    devices = ", ".join(dict.fromkeys(df["device_name"].astype(str)))
    problems = list(dict.fromkeys(df["problem"].astype(str)))
    parts = [f"# ipa-bench results: {devices}", ""]
    if problems != ["simplified"]:
        parts.append(f"Problem{'s' if len(problems) > 1 else ''}: {', '.join(problems)} "
                     "(docs/problems.md; each in tables of its own).")
    runs = df.groupby("run_id")["started_at"].first().sort_values()
    parts.append(f"Runs: {', '.join(f'{r} ({t})' for r, t in runs.items())}.")
    counts = ", ".join(f"{n} {s}" for s, n in df["status"].value_counts().items())
    parts.append(f"Rows: {len(df)} ({counts}).")
    for title, mode, ddf in _sections(df):
        nslice = length_slice(ddf)
        variants = list(dict.fromkeys(nslice["variant"]))
        parts += ["", f"## {title}: {shape_label(nslice)}", ""]
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
            ["N", "fastest passing", "median ms", "speedup vs baseline", "peak MiB",
             ERR_RATIO_LABEL],
            best_rows))
        tables = [("Median latency (ms)", "median_ms", ".4g")]
        if mode == "eager":  # a graph replay's memory is the eager call's
            tables.append(("Extra peak memory (MiB)", "peak_mem_mib", ".4g"))
        for title, column, spec in tables:
            table = [[str(n)] + [_cell(rows, v, column, spec) for v in variants]
                     for n, rows in nslice.groupby("length")]
            parts += ["", f"{title}:", "", markdown_table(["N"] + variants, table)]
        if several_shapes(ddf):
            parts += ["", *shapes_table(ddf)]
    noisy = df[has_flag(df, "noisy")]
    if not noisy.empty:
        parts += ["", f"{len(noisy)} timed row(s) are marked `(noisy)`: {FLAGS['noisy']}. "
                  "Their speed-ups are not to be trusted."]
    host = df[has_flag(df, "host-bound")]
    if not host.empty:
        parts += ["", f"{len(host)} timed row(s) are marked `(host)`, host-bound: "
                  f"{FLAGS['host-bound']}."]
    slow = df[has_flag(df, "slow-host")]
    if not slow.empty:
        parts += ["", f"{len(slow)} of them are marked `(slow host)`: {FLAGS['slow-host']}."]
    failed = df[df["status"] != "ok"]
    untimed = df[(df["status"] == "ok") & df["median_ms"].isna()]
    parts += ["", "## Failures, unsupported and untimed cells", ""]
    if failed.empty and untimed.empty:
        parts.append("None: every cell passed.")
    elif failed.empty:
        parts.append(f"None failed, but {len(untimed)} `ok` row(s) carry no median_ms "
                     "(an edited or foreign table?).")
    else:
        several = len(problems) > 1
        parts.append(markdown_table(
            (["problem"] if several else [])
            + ["variant", "dtype", "mode", "pass", "B", "N", "H", "Qp", "Vp", "status", "reason"],
            [([r["problem"]] if several else [])
             + [r["variant"], r["dtype"], r["mode"], r["pass"], *(str(r[c]) for c in (
                 "batch", "length", "heads", "query_points", "value_points")), r["status"],
                "" if pd.isna(r["reason"]) else str(r["reason"])]
             for r in failed.to_dict("records")]))
    return "\n".join(parts) + "\n"


def run_report(args: argparse.Namespace) -> int:
    # Several files: one table, a cell measured in more than one counting by the last file's row.
    frames = [read_results(path) for path in args.results]
    df = frames[0] if len(frames) == 1 else latest_per_key(pd.concat(frames, ignore_index=True))
    print(report(df), end="")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="markdown summary of a sweep",
        description="Print a markdown summary of a sweep: fastest passing variant per N and "
        "dtype, speedups, memory, and every failed or unsupported cell. Several CSVs (e.g. the "
        "kernels' sweep and the anchors' of the same grid, on the same GPU model) are reported "
        "as one; a cell in more than one counts by the last file's row.")
    p.add_argument("results", metavar="RESULTS.csv", nargs="+")
    p.set_defaults(run=run_report)
