"""`ipa-bench plot RESULTS.csv`: latency, speedup, memory, error-vs-latency and % of floor.

One figure per metric and dtype, over the N slice of the grid (the rows that share the most
common batch/heads/points/dims). Titles carry the device name and dtype. Cells that did not
produce a number (oom, error, unsupported) are drawn as labelled crosses on the bottom
edge; mismatches keep their timing but are drawn hollow and listed in the legend.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

SHAPE_COLUMNS = ["batch", "heads", "node_dim", "pair_dim", "query_points", "value_points"]
NO_NUMBER = ("oom", "error", "unsupported")
METRICS = {
    # name: (column, y label, log y)
    "latency": ("median_ms", "median latency (ms)", True),
    "speedup": ("speedup_vs_baseline", "speedup over the baseline (x)", True),
    "memory": ("peak_mem_mib", "extra peak memory (MiB)", True),
    "pct_of_floor": ("pct_of_floor", "% of the memory floor's speed", False),
}


def load_results(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"RESULTS.csv: no such file {str(path)!r}")
    return pd.read_csv(path)


def length_slice(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the shape (batch, heads, ...) that covers the most distinct lengths."""
    counts = df.groupby(SHAPE_COLUMNS)["length"].nunique()
    shape = counts.idxmax()
    mask = (df[SHAPE_COLUMNS] == pd.Series(shape, index=SHAPE_COLUMNS)).all(axis=1)
    return df[mask]


def shape_label(df: pd.DataFrame) -> str:
    r = df.iloc[0]
    return (f"B={r.batch} H={r.heads} Qp={r.query_points} Vp={r.value_points} "
            f"node={r.node_dim} pair={r.pair_dim}")


def plot_metric(ax, df: pd.DataFrame, column: str, log_y: bool) -> None:
    for i, (variant, rows) in enumerate(df.groupby("variant", sort=False)):
        color = f"C{i}"
        for mode, style, marker in (("eager", "-", "o"), ("graph", "--", "s")):
            mrows = rows[rows["mode"] == mode].sort_values("length")
            good = mrows[mrows["status"] == "ok"].dropna(subset=[column])
            label = variant if mode == "eager" else f"{variant} (graph)"
            if not good.empty:
                ax.plot(good["length"], good[column], style, marker=marker, color=color,
                        label=label)
            bad = mrows[mrows["status"] == "mismatch"].dropna(subset=[column])
            if not bad.empty:
                ax.plot(bad["length"], bad[column], "o", mfc="none", mec="red", mew=2,
                        label=f"{label}: MISMATCH")
        missing = rows[rows["status"].isin(NO_NUMBER) & (rows["mode"] == "eager")]
        if not missing.empty:
            statuses = "/".join(dict.fromkeys(missing["status"]))
            ax.plot(missing["length"], [0.0] * len(missing), "x", color=color, ms=10, mew=2,
                    clip_on=False, transform=ax.get_xaxis_transform(),
                    label=f"{variant}: {statuses} (no number)")
    ax.set_xscale("log", base=2)
    if log_y and (df[column].dropna() > 0).any():
        ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.grid(True, which="both", alpha=0.3)


def _title(df: pd.DataFrame, what: str, dtype: str) -> str:
    return f"{what}: {df['device_name'].iloc[0]}, {dtype}\n{shape_label(df)}"


def plot_results(csv_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Write every plot for `csv_path` into `out_dir` as PNG and SVG; return the PNG paths."""
    df = load_results(csv_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for dtype, ddf in df.groupby("dtype", sort=False):
        nslice = length_slice(ddf)
        for name, (column, ylabel, log_y) in METRICS.items():
            fig, ax = plt.subplots(figsize=(7, 4.5))
            data = nslice if name == "latency" else nslice[nslice["mode"] == "eager"]
            if data[column].notna().any() or data["status"].isin(NO_NUMBER).any():
                plot_metric(ax, data, column, log_y)
            if data[column].isna().all():
                ax.text(0.5, 0.5, f"no {column} recorded (e.g. memory is not measured on CPU)",
                        transform=ax.transAxes, ha="center")
            if name == "speedup":
                ax.axhline(1.0, color="gray", lw=1)
            if name == "pct_of_floor":
                ax.axhline(100.0, color="gray", lw=1, ls=":")
            ax.set_ylabel(ylabel)
            ax.set_title(_title(nslice, name.replace("_", " "), dtype), fontsize=9)
            _finish(fig, ax, out_dir / f"{name}_{dtype}", written)
        written.append(_plot_error_vs_latency(ddf, dtype, out_dir))
    return written


def _plot_error_vs_latency(ddf: pd.DataFrame, dtype: str, out_dir: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = ddf[(ddf["mode"] == "eager") & ddf["status"].isin(["ok", "mismatch"])]
    for i, (variant, vrows) in enumerate(rows.groupby("variant", sort=False)):
        ok = vrows[vrows["status"] == "ok"]
        ax.scatter(ok["median_ms"], ok["rel_l2"], color=f"C{i}", label=variant, s=18)
        bad = vrows[vrows["status"] == "mismatch"]
        if not bad.empty:
            ax.scatter(bad["median_ms"], bad["rel_l2"], facecolors="none", edgecolors="red",
                       label=f"{variant}: MISMATCH", s=30)
    if not rows.empty:
        ax.set_xscale("log")
        if (rows["rel_l2"] > 0).any():
            ax.set_yscale("log")
        ax.axhline(rows["tol"].max(), color="gray", ls=":", lw=1, label="largest tolerance")
    ax.set_xlabel("median latency (ms)")
    ax.set_ylabel("rel_l2 vs float64 oracle")
    ax.set_title(f"accuracy vs speed: {ddf['device_name'].iloc[0]}, {dtype} (all cells)",
                 fontsize=9)
    written: list[Path] = []
    _finish(fig, ax, out_dir / f"error_vs_latency_{dtype}", written)
    return written[0]


def _finish(fig, ax, stem: Path, written: list[Path]) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(stem.with_suffix(suffix), dpi=120)
    plt.close(fig)
    written.append(stem.with_suffix(".png"))


def run_plot(args: argparse.Namespace) -> int:
    out = args.output or Path(args.results).parent / "plots"
    for path in plot_results(args.results, out):
        print(path)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plot", help="draw latency, speedup, memory, error-vs-latency, %% of floor",
        description="Draw one PNG+SVG per metric and dtype from a sweep's results.csv. "
        "Failed or unsupported cells are marked, never silently missing.")
    p.add_argument("results", metavar="RESULTS.csv")
    p.add_argument("-o", "--output", type=Path, help="output folder (default: plots/ beside "
                   "the CSV)")
    p.set_defaults(run=run_plot)
