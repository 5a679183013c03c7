"""`ipa-bench plot RESULTS.csv`: latency, speedup, memory, % of floor, accuracy vs latency.

One figure per metric, problem and dtype, over the N slice of the grid (the rows that share
the most common batch/heads/points/dims), each written as PNG and SVG; a problem other than
`simplified` adds `_<problem>` to the file names. Titles carry the device name and dtype.
Every variant keeps one colour and marker in every figure of every run (`variant_style`).
Cells that did not produce a number (oom, error, unsupported) are drawn as labelled crosses
on the bottom edge; mismatches keep their timing but are drawn hollow
red and listed in the legend (red is kept for them: no variant is drawn in red).

Latency: log-log, eager lines solid and CUDA-graph replays dashed, each with its p20-p80
band, and the memory floor (SPEC's minimum bytes over the measured copy bandwidth, column
`floor_ms`) as a black dashed line. Accuracy vs latency: per dtype, at the smallest, middle
and largest N, each variant's median latency against its error relative to the eager
reference's own (`err_ratio`; `rel_l2` against the float64 oracle where that is undefined,
as in fp64), with the Pareto front of the passing points. A figure with nothing to draw
(memory on CPU, which is not measured) is not written; `plot_results` says which and why.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
from collections.abc import Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from harness.problems import DEFAULT, PROBLEMS  # noqa: E402
from harness.results import ERR_RATIO_LABEL, NO_NUMBER, SHAPE_COLUMNS, read_results  # noqa: E402
from variants.problem import IPAInputError  # noqa: E402

METRICS = {
    # name: (column, y label, log y); drawn against N, eager rows (latency: every mode)
    "latency": ("median_ms", "median latency (ms); band: p20-p80 of the samples", True),
    "speedup": ("speedup_vs_baseline", "speedup over the baseline (x)", True),
    "memory": ("peak_mem_mib", "extra peak memory (MiB)", True),
    "pct_of_floor": ("pct_of_floor", "% of the memory floor's speed", False),
}
FLOOR_LABEL = "memory floor (min bytes / copy bandwidth)"
MODE_LINES = {"eager": "-", "graph": "--"}

# Registry variants (built-ins in display order) take these in turn: tab10 without its red,
# then tab20's light shades of its blue, orange, green and purple.
_FIXED_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#e377c2",
                 "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5"]
_FIXED_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p", "d"]
# Any other name (a plugin, `model-new:FILE`): a hash of the name into a palette of its own.
_OTHER_COLORS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
                 "#666666"]
_OTHER_MARKERS = ["*", "h", "p", "d", "8", "H"]


@functools.cache
def _registry_order() -> list[str]:
    """Built-in variant names in registry order, each once (`reference` and `torch-compile`
    exist in every problem and keep one style; entry points are excluded: their order depends
    on what else is installed, so they take the hashed styles)."""
    from variants.registry import BUILTIN

    return list(dict.fromkeys(cls.name for cls in BUILTIN))


def variant_style(name: str) -> dict[str, str]:
    """The colour and marker of variant `name`, the same in every figure and results folder:
    the registry's built-ins by their place in the registry, any other name by a hash of it
    into a separate palette (so it never takes a built-in's colour)."""
    order = _registry_order()
    if name in order and order.index(name) < len(_FIXED_COLORS):
        i = order.index(name)
        return {"color": _FIXED_COLORS[i], "marker": _FIXED_MARKERS[i]}
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return {"color": _OTHER_COLORS[h % len(_OTHER_COLORS)],
            "marker": _OTHER_MARKERS[(h // len(_OTHER_COLORS)) % len(_OTHER_MARKERS)]}


def length_slice(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the shape (batch, heads, ...) that covers the most distinct lengths; among
    shapes that cover as many, the problem's default layer at B = 1 (a sweep of slices around
    it), else the first."""
    counts = df.groupby(SHAPE_COLUMNS)["length"].nunique()
    widest = list(counts[counts == counts.max()].index)
    default = default_shape(str(df["problem"].iloc[0]) if "problem" in df else DEFAULT)
    shape = default if default in widest else widest[0]
    mask = (df[SHAPE_COLUMNS] == pd.Series(shape, index=SHAPE_COLUMNS)).all(axis=1)
    return df[mask]


def default_shape(problem: str) -> tuple | None:
    """The SHAPE_COLUMNS values of `problem`'s default layer at B = 1 (None: a problem this
    version does not know)."""
    if problem not in PROBLEMS:
        return None
    columns = {"batch": 1, **PROBLEMS[problem].config_class().columns()}
    return tuple(columns[c] for c in SHAPE_COLUMNS)


def shape_label(df: pd.DataFrame) -> str:
    """The N slice's shape; the per-head width `C` where it is not node / H (openfold)."""
    r = df.iloc[0]
    width = "" if r.head_dim == r.node_dim // r.heads else f" C={r.head_dim}"
    return (f"B={r.batch} H={r.heads}{width} Qp={r.query_points} Vp={r.value_points} "
            f"node={r.node_dim} pair={r.pair_dim}")


_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")


def plot_metric(ax, df: pd.DataFrame, column: str, log_y: bool,
                bands: bool | None = None) -> None:
    """`column` against N, one line per variant and mode, in the variant's style. `bands`
    (default: on for `median_ms`) shades p20-p80 around each line."""
    if bands is None:
        bands = column == "median_ms"
    for variant, rows in df.groupby("variant", sort=False):
        style = variant_style(variant)
        for mode, line in MODE_LINES.items():
            mrows = rows[rows["mode"] == mode].sort_values("length")
            good = mrows[mrows["status"] == "ok"].dropna(subset=[column])
            label = variant if mode == "eager" else f"{variant} (graph)"
            if not good.empty:
                ax.plot(good["length"], good[column], line, label=label, ms=5, **style)
                if bands:
                    ax.fill_between(good["length"], good["p20_ms"], good["p80_ms"],
                                    color=style["color"], alpha=0.2, lw=0)
            bad = mrows[mrows["status"] == "mismatch"].dropna(subset=[column])
            if not bad.empty:
                ax.plot(bad["length"], bad[column], ls="none", marker=style["marker"],
                        mfc="none", mec="red", mew=2, ms=8, label=f"{label}: MISMATCH")
        missing = rows[rows["status"].isin(NO_NUMBER) & (rows["mode"] == "eager")]
        if not missing.empty:
            statuses = "/".join(dict.fromkeys(missing["status"]))
            ax.plot(missing["length"], [0.0] * len(missing), "x", color=style["color"], ms=10,
                    mew=2, clip_on=False, transform=ax.get_xaxis_transform(),
                    label=f"{variant}: {statuses} (no number)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_PLAIN)
    if log_y and (df[column].dropna() > 0).any():
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_PLAIN)
    ax.set_xlabel("sequence length N")
    ax.grid(True, which="both", alpha=0.3)


def _plain_log_ticks(ax, which: str) -> None:
    """Numbers, not powers, on a log axis, with minor ticks labelled where the axis spans
    few decades: all of them under one, those at 2 and 5 x 10^k under three."""
    low, high = ax.get_xlim() if which == "x" else ax.get_ylim()
    keep = None if high < 10 * low else ((2, 5) if high < 1000 * low else ())

    def minor(value, _):
        mantissa = round(value / 10 ** np.floor(np.log10(value)))
        return f"{value:g}" if keep is None or mantissa in keep else ""

    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(_PLAIN)
    axis.set_minor_formatter(FuncFormatter(minor))


def _devices(df: pd.DataFrame) -> str:
    return ", ".join(dict.fromkeys(df["device_name"].astype(str)))


def _title(df: pd.DataFrame, what: str, dtype: str) -> str:
    problems = list(dict.fromkeys(df["problem"].astype(str)))
    problem = "" if problems == [DEFAULT] else f", problem {', '.join(problems)}"
    return f"{what}: {_devices(df)}, {dtype}{problem}\n{shape_label(df)}"


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _statuses(data: pd.DataFrame) -> str:
    return ", ".join(f"{n} {s}" for s, n in data["status"].value_counts().items())


def _why_empty(data: pd.DataFrame, column: str) -> str:
    if column == "peak_mem_mib" and (data["device"] == "cpu").all():
        return "peak memory is not measured on CPU (column peak_mem_mib is empty)"
    return f"no row has a {column} value (rows: {_statuses(data)})"


def metric_figure(nslice: pd.DataFrame, name: str, dtype: str) -> Figure | str:
    """The figure of METRICS[name] over the N slice of one dtype, or why there is none."""
    column, ylabel, log_y = METRICS[name]
    data = nslice if name == "latency" else nslice[nslice["mode"] == "eager"]
    if data[column].isna().all():
        return _why_empty(data, column)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    plot_metric(ax, data, column, log_y)
    if name == "latency":
        floor = data.groupby("length")["floor_ms"].median().dropna()
        if not floor.empty:
            ax.plot(floor.index, floor.values, "--", color="black", lw=1.5, label=FLOOR_LABEL)
    if name == "speedup":
        ax.axhline(1.0, color="gray", lw=1)
    if name == "pct_of_floor":
        ax.axhline(100.0, color="gray", lw=1, ls=":")
    ax.set_ylabel(ylabel)
    ax.set_title(_title(nslice, name.replace("_", " "), dtype), fontsize=9)
    _legend(ax)
    return fig


def pareto_front(points: pd.DataFrame, x: str = "median_ms",
                 y: str = "err_ratio") -> pd.DataFrame:
    """The points no other point beats in both `x` and `y` (lower is better in each; of
    equal points the first is kept), fastest first."""
    points = points.sort_values([x, y], kind="stable")
    keep, best = [], np.inf
    for index, value in points[y].items():
        if value < best:
            keep.append(index)
            best = value
    return points.loc[keep]


def _error_column(timed: pd.DataFrame) -> tuple[str, str]:
    """(column, axis label): err_ratio where every timed point has one, else rel_l2."""
    if timed["err_ratio"].notna().all():
        return "err_ratio", f"{ERR_RATIO_LABEL}: error over the eager reference's own"
    return "rel_l2", "rel_l2 vs the float64 oracle (err/ref undefined, e.g. fp64)"


def pareto_figure(ddf: pd.DataFrame, dtype: str) -> Figure | str:
    """Accuracy vs median latency over one dtype's N slice (eager), at its smallest, middle and
    largest N, with each panel's Pareto front of the passing points; or why there is none."""
    nslice = length_slice(ddf)
    timed = nslice[(nslice["mode"] == "eager") & nslice["status"].isin(["ok", "mismatch"])]
    timed = timed.dropna(subset=["median_ms"])
    if timed.empty:
        return f"no eager row with a latency to place (rows: {_statuses(nslice)})"
    column, ylabel = _error_column(timed)
    timed = timed.assign(err=timed[column])
    lengths = sorted(timed["length"].unique())
    chosen = sorted({lengths[0], lengths[len(lengths) // 2], lengths[-1]})
    fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen) + 2.2, 4.5),
                             squeeze=False, layout="constrained")
    for ax, length in zip(axes[0], chosen, strict=True):
        at_n = timed[timed["length"] == length]
        drawable = at_n[np.isfinite(at_n["err"]) & (at_n["err"] > 0)]
        ok = drawable[drawable["status"] == "ok"]
        for variant, vrows in ok.groupby("variant", sort=False):
            ax.scatter(vrows["median_ms"], vrows["err"], s=40, zorder=3, label=variant,
                       **variant_style(variant))
        front = pareto_front(ok, y="err")
        if not front.empty:
            ax.step(front["median_ms"], front["err"], where="post", color="black", lw=1.2,
                    zorder=2, label="Pareto front: no other point both faster and more accurate")
            ax.scatter(front["median_ms"], front["err"], s=180, facecolors="none",
                       edgecolors="black", zorder=2, label="on the Pareto front")
        for variant, vrows in drawable[drawable["status"] == "mismatch"].groupby("variant"):
            ax.scatter(vrows["median_ms"], vrows["err"], s=70, facecolors="none",
                       edgecolors="red", lw=2, marker=variant_style(variant)["marker"],
                       zorder=4, label=f"{variant}: MISMATCH")
        if column == "err_ratio":
            ax.axhline(1.0, color="gray", ls=":", lw=1, label="as accurate as the reference")
        lost = len(at_n) - len(drawable)
        if lost:
            ax.text(0.02, 0.02, f"{lost} point(s) with an infinite or zero error not drawn",
                    transform=ax.transAxes, fontsize=7, color="red")
        ax.set_xscale("log")
        if not drawable.empty:
            ax.set_yscale("log")
        _plain_log_ticks(ax, "x")
        if not drawable.empty:
            _plain_log_ticks(ax, "y")
        ax.tick_params(which="both", labelsize=7)
        ax.set_xlabel("median latency (ms)")
        ax.set_title(f"N = {length}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(_title(nslice, "accuracy vs latency (eager)", dtype), fontsize=9)
    handles = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7, loc="upper left",
                       bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    return fig


SHAPE_TITLES = {"batch": "B", "heads": "H", "head_dim": "C", "node_dim": "node",
                "pair_dim": "pair", "query_points": "Qp", "value_points": "Vp"}


def several_shapes(rows: pd.DataFrame) -> bool:
    """Whether `rows` hold more than one layer shape (a sweep of slices)."""
    return rows.groupby(SHAPE_COLUMNS).ngroups > 1


def rank_shapes(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per shape and N of `rows` (one pass, mode and dtype of a sweep of slices): the
    shape columns that vary (titled as `SHAPE_TITLES`), N, the fastest passing variant and its
    median, then per variant its median over the fastest's (a float; 1.0 is the fastest) or,
    where it has no time, its status ("not run" where it has no row)."""
    varying = [c for c in SHAPE_COLUMNS if rows[c].nunique() > 1]
    variants = list(dict.fromkeys(rows["variant"]))
    lines = []
    for key, cell in rows.groupby([*varying, "length"]):
        ok = cell[cell["status"] == "ok"].dropna(subset=["median_ms"])
        fastest = ok.loc[ok["median_ms"].idxmin()] if not ok.empty else None
        line = dict(zip([SHAPE_TITLES[c] for c in varying] + ["N"], key, strict=True))
        line["fastest"] = "none passed" if fastest is None else fastest["variant"]
        line["ms"] = math.nan if fastest is None else fastest["median_ms"]
        for variant in variants:
            timed = ok[ok["variant"] == variant]["median_ms"]
            match = cell[cell["variant"] == variant]
            line[variant] = (timed.iloc[0] / fastest["median_ms"] if not timed.empty
                             else "not run" if match.empty else str(match["status"].iloc[0]))
        lines.append(line)
    return pd.DataFrame(lines)


def shapes_figure(ddf: pd.DataFrame, dtype: str) -> Figure | str:
    """Each variant's median over the fastest passing variant's, at every shape and N of one
    dtype's rows, one panel per timing mode (a sweep of slices: `default` preset); or why
    there is none (a sweep of one shape)."""
    if not several_shapes(ddf):
        return "the sweep has one shape: the N-slice figures show it"
    modes = [m for m in MODE_LINES if (ddf["mode"] == m).any()]
    ranked = {m: rank_shapes(ddf[ddf["mode"] == m]) for m in modes}
    height = max(len(r) for r in ranked.values())
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes) + 1.5, 0.32 * height + 2),
                             squeeze=False, layout="constrained")
    for ax, mode in zip(axes[0], modes, strict=True):
        table = ranked[mode]
        columns = list(table.columns)  # shape columns, N, "fastest", "ms", then the variants
        shape, variants = columns[:columns.index("fastest")], columns[columns.index("ms") + 1:]
        labels = [" ".join(f"{k}={line[k]}" for k in shape) for _, line in table.iterrows()]
        ratios = table[variants].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        image = ax.imshow(np.log2(ratios), cmap="Reds", vmin=0, vmax=2, aspect="auto")
        for (i, j), value in np.ndenumerate(ratios):
            text = f"{value:.2f}" if np.isfinite(value) else str(table[variants[j]].iloc[i])
            ax.text(j, i, text, ha="center", va="center", fontsize=6,
                    color="white" if np.isfinite(value) and value > 2.5 else "black")
        ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right", fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_title(mode, fontsize=9)
    fig.colorbar(image, ax=axes[0][-1], label="log2 of median over the fastest's")
    fig.suptitle(f"every shape: each variant's median over the fastest passing one's: "
                 f"{_devices(ddf)}, {dtype}", fontsize=9)
    return fig


def figures(df: pd.DataFrame) -> Iterator[tuple[str, Figure | str]]:
    """(file stem, figure or the reason it is not drawn) for every figure of every problem,
    pass and dtype: rows of two problems never share a figure. The caller closes each
    figure."""
    for (problem, pass_name, dtype), ddf in df.groupby(["problem", "pass", "dtype"],
                                                       sort=False):
        # Training rows (forward+backward) get figures of their own, `*_<dtype>_training`,
        # and a problem other than the default its own, `*_<problem>`.
        label, stem = ((dtype, dtype) if pass_name == "forward"
                       else (f"{dtype}, forward+backward", f"{dtype}_training"))
        if problem != DEFAULT:
            stem = f"{stem}_{problem}"
        nslice = length_slice(ddf)
        for name in METRICS:
            yield f"{name}_{stem}", metric_figure(nslice, name, label)
        yield f"error_vs_latency_{stem}", pareto_figure(ddf, label)
        if several_shapes(ddf):
            yield f"shapes_{stem}", shapes_figure(ddf, label)


class Figures(list):
    """The PNG paths written (a list, as `plot_results` always returned) and `skipped`: one
    message per figure not drawn, with the reason."""

    def __init__(self, written=(), skipped=()):
        super().__init__(written)
        self.skipped: list[str] = list(skipped)


def plot_results(csv_path: str | Path, out_dir: str | Path, *, force: bool = True) -> Figures:
    """Write every figure for `csv_path` into `out_dir` as PNG and SVG; return the PNG paths,
    with `.skipped` for figures not drawn. Unless `force`, an existing figure file of the same
    name is an error, checked before anything is written. A symbolic link is never written
    through."""
    df = read_results(csv_path)
    out_dir = Path(out_dir)
    if out_dir.is_symlink():
        raise IPAInputError(f"-o/--output: expected a folder, got a symbolic link {str(out_dir)!r}")
    drawn = [(stem, fig) for stem, fig in figures(df)]
    targets = [out_dir / f"{stem}{suffix}" for stem, fig in drawn if not isinstance(fig, str)
               for suffix in (".png", ".svg")]
    existing = [t for t in targets if t.exists() or t.is_symlink()]
    if existing and not force:
        for _, fig in drawn:
            if not isinstance(fig, str):
                plt.close(fig)
        raise IPAInputError(
            f"-o/--output {str(out_dir)!r}: {len(existing)} figure(s) exist there already (e.g. "
            f"{existing[0].name}); nothing was written. Pass --force to replace them, or -o "
            "another folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = Figures()
    for stem, fig in drawn:
        if isinstance(fig, str):
            result.skipped.append(f"{stem}: not drawn: {fig}")
            continue
        for suffix in (".png", ".svg"):
            target = out_dir / f"{stem}{suffix}"
            target.unlink(missing_ok=True)  # a link is removed, never followed
            fig.savefig(target, dpi=120, bbox_inches="tight")
        plt.close(fig)
        result.append(out_dir / f"{stem}.png")
    return result


def run_plot(args: argparse.Namespace) -> int:
    out = args.output or Path(args.results).parent / "plots"
    result = plot_results(args.results, out, force=args.force)
    for path in result:
        print(path)
    for message in result.skipped:
        print(message)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plot", help="draw latency, speedup, memory, %% of floor, accuracy vs latency",
        description="Draw one PNG+SVG per metric and dtype from a sweep's results.csv: "
        "{latency,speedup,memory,pct_of_floor,error_vs_latency}_{dtype} (+ _training for "
        "forward+backward rows, + _openfold for that problem's rows). Failed or "
        "unsupported cells are marked, never silently missing; a figure with nothing to draw "
        "(memory on CPU) is not written and the command says so. Existing figures of the same "
        "name are replaced only with --force.")
    p.add_argument("results", metavar="RESULTS.csv")
    p.add_argument("-o", "--output", type=Path, help="output folder (default: plots/ beside "
                   "the CSV)")
    p.add_argument("--force", action="store_true",
                   help="replace figures of the same name in the output folder")
    p.set_defaults(run=run_plot)
